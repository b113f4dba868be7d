"""Fault: every ZooKeeper server down for 30 s, then back (issue 12, fault 3), on the
standalone server and on the 3-node ensemble.

Pollers stop firing within their lease, so no shard has two owners firing; they do not
crash or exit while their session can be recovered; a member whose session was lost
exits 3 and the test, as its supervisor, starts another. Firing resumes within the
session timeout + 5 s of ZooKeeper's return.
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter

import pytest

from scheduler import Client
from scheduler.domain.clock import SystemClock
from scheduler.store import SchemaOptions, open_store
from tests.conftest import ZOOKEEPER_HOSTS, cassandra_url
from tests.faultload import Pollers, Producer, measure, now_ms, preload, wait_fired
from tests.handlers import read_records
from tests.procs import ROOT, wait_until

pytestmark = pytest.mark.fault
OPS = ROOT / "ops" / "zookeeper"
SESSION_S = 6.0
OUTAGE_S = 30
LAYOUTS = {
    "standalone": ([], ZOOKEEPER_HOSTS),
    "ensemble": (["--nodes", "3"], "127.0.0.1:2191,127.0.0.1:2192,127.0.0.1:2193"),
}


def zk_ops(args: list[str], cmd: str) -> None:
    subprocess.run([str(OPS), *args, cmd], check=True, capture_output=True, timeout=120)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_zookeeper_server_down_30s(layout, cassandra_keyspace, zookeeper_available, tmp_path):
    args, hosts = LAYOUTS[layout]
    zk_ops(args, "start")
    url = cassandra_url(cassandra_keyspace)
    store = open_store(url)
    store.apply_schema(SchemaOptions(shard_count=8, bucket_width_s=10), SystemClock().now_ms())
    client = Client(store)
    out = tmp_path / "fired.log"
    zk = f"zookeeper://{hosts}/fault-{layout}-{time.time_ns()}"
    pollers = Pollers(url, out, "--coordinator", zk, "--session-timeout", str(SESSION_S))
    producer = Producer(client)
    down = False
    try:
        due = preload(client, 700, 70, lead_s=4)
        pollers.start(2)
        producer.start()
        wait_until(lambda: len({r.pid for r in read_records(str(out))}) == 2, 30, "both pollers firing")
        time.sleep(2)
        stop_at = now_ms()
        zk_ops(args, "stop")
        # The ensemble stops one server after the other and serves until the second
        # goes: the quorum is surely lost once the command returns.
        down_at = now_ms()
        down = True
        end = time.monotonic() + OUTAGE_S
        while time.monotonic() < end:
            pollers.supervise()
            time.sleep(0.5)
        start_at = now_ms()
        zk_ops(args, "start")
        down = False
        back_at = now_ms()
        time.sleep(SESSION_S + 5)
        producer.stop()
        due.update(producer.acked)
        records = wait_fired(out, due, 60, supervise=pollers)
    finally:
        producer.stop()
        if down:
            subprocess.run([str(OPS), *args, "start"], capture_output=True, timeout=120)
        codes = pollers.stop()
        client.close()
        store.close()
        if layout == "ensemble":
            subprocess.run([str(OPS), *args, "stop"], capture_output=True, timeout=60)

    lease_end = down_at + SESSION_S / 2 * 1000 + 500
    during = [r for r in records if lease_end < r.fired_ms < start_at]
    report = measure(f"zookeeper {layout} down 30 s", records, due,
                     window=(stop_at - 3000, max(due.values()) - 2000), recovered_at_ms=back_at)
    counts = Counter(r.job_id for r in records)
    report.notes = {"fired_during_outage_after_lease": len(during),
                    "restarts_after_session_loss": pollers.restarts,
                    "crashes": len(pollers.crashes), "exit_codes": codes,
                    "zookeeper_start_s": round((back_at - start_at) / 1000, 1)}
    report.save()
    assert not during, f"fired while no lease could be renewed: {during[:3]}"
    assert report.lost == 0 and report.early == 0, report
    assert not pollers.crashes, report
    assert report.recovery_s is not None and report.recovery_s <= SESSION_S + 5, report
    # No shard had two owners firing; a member restarted after a lost session may
    # re-fire what it had running (at most --concurrency each).
    assert report.duplicates <= 16 * pollers.restarts, (report, counts.most_common(3))
