"""Faults: one poller cut off from one server while the rest of the fleet reaches it
(issue 12, faults 4 and 5). The cut is a partition made by ``tests/faultproxy.py``
between that poller and the server: silence, not refusals.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from scheduler import Client
from scheduler.domain.clock import SystemClock
from scheduler.fleet.view import read_fleet
from scheduler.store import SchemaOptions, open_store
from tests.conftest import CASSANDRA_HOSTS, CASSANDRA_PORT, ZOOKEEPER_HOSTS, cassandra_url
from tests.faultload import Pollers, Producer, duplicate_ids, measure, now_ms, preload, wait_fired
from tests.faultproxy import FaultProxy
from tests.handlers import read_records
from tests.procs import wait_until

pytestmark = pytest.mark.fault
SESSION_S = 6.0


def fleet_setup(keyspace: str) -> tuple[str, Client]:
    url = cassandra_url(keyspace)
    store = open_store(url)
    store.apply_schema(SchemaOptions(shard_count=8, bucket_width_s=10), SystemClock().now_ms())
    store.close()
    return url, Client(url)  # owns its store: close() ends the driver's threads too


def owners(zk: str) -> tuple[list[str], dict[int, str]]:
    snap = read_fleet(zk)
    assert snap is not None
    return snap.members, snap.owners


def test_poller_cut_off_from_cassandra_releases_its_shards_and_rejoins(cassandra_keyspace, zk_root,
                                                                      tmp_path):
    url, client = fleet_setup(cassandra_keyspace)
    out = tmp_path / "fired.log"
    zk = f"zookeeper://{ZOOKEEPER_HOSTS}{zk_root}"
    pollers = Pollers(url, out, "--coordinator", zk, "--session-timeout", str(SESSION_S),
                      "--store-failure-release", "8")
    proxy = FaultProxy(CASSANDRA_HOSTS.split(",")[0], CASSANDRA_PORT)
    producer = Producer(client)
    try:
        due = preload(client, 700, 70, lead_s=4)
        cut_off = pollers.start(1, url=url.replace(f":{CASSANDRA_PORT}/", f":{proxy.port}/"),
                                extra=["--name", "cut-off"])[0]
        pollers.start(1, extra=["--name", "healthy"])
        producer.start()
        wait_until(lambda: len({r.pid for r in read_records(str(out))}) == 2, 30, "both pollers firing")
        wait_until(lambda: len(owners(zk)[1]) == 8, 20, "every shard owned")
        assert "cut-off" in owners(zk)[1].values()
        cut_at = now_ms()
        proxy.cut()
        # 10 s for the first request to time out, then 8 s of failing calls.
        wait_until(lambda: "cut-off" not in owners(zk)[0], 40, "the cut-off poller to leave")
        left_at = now_ms()
        wait_until(lambda: set(owners(zk)[1].values()) == {"healthy"} and len(owners(zk)[1]) == 8,
                   15, "the healthy poller to own every shard")
        taken_at = now_ms()
        time.sleep(6)
        members, held = owners(zk)
        assert "cut-off" not in members and "cut-off" not in held.values(), "it takes none back"
        proxy.restore()
        restored_at = now_ms()
        wait_until(lambda: "cut-off" in owners(zk)[1].values(), 30, "the cut-off poller to rejoin")
        rejoined_at = now_ms()
        producer.stop()
        due.update(producer.acked)
        records = wait_fired(out, due, 90, supervise=pollers)
    finally:
        producer.stop()
        codes = pollers.stop()
        proxy.close()
        client.close()

    window = (cut_at - 3000, max(due.values()) - 2000)
    report = measure("poller cut off from cassandra", records, due, window=window)
    report.recovery_s = round((taken_at - cut_at) / 1000, 2)
    # From 1 s before the cut: a job fired just before it has its outcome gathered by the
    # recorder (up to 100 ms) or in flight when the partition starts, and the proxy
    # drops what it had buffered. README, "Duplicates": finished in the last ~100 ms,
    # plus outcomes whose write was in flight.
    fired_in_cut = {r.job_id for r in records
                    if r.pid == cut_off.pid and cut_at - 1000 <= r.fired_ms <= restored_at}
    dups = duplicate_ids(records)
    report.notes = {"left_after_s": round((left_at - cut_at) / 1000, 1),
                    "shards_taken_after_s": report.recovery_s,
                    "rejoined_after_restore_s": round((rejoined_at - restored_at) / 1000, 1),
                    "fired_while_cut": len(fired_in_cut), "exit_codes": codes,
                    "restarts": pollers.restarts}
    report.save()
    assert report.lost == 0 and report.early == 0, report
    # Only jobs the cut-off poller fired and could not record may repeat.
    unexplained = [(r.job_id, "cut-off" if r.pid == cut_off.pid else "healthy", r.fired_ms - cut_at)
                   for r in records if r.job_id in dups - fired_in_cut]
    assert dups <= fired_in_cut, (unexplained[:10], report)
    assert not pollers.crashes and codes == [0, 0], report
    log = Path(f"{out}.log").read_text()
    assert '"action": "member_stepped_out"' in log and '"action": "member_rejoined"' in log


def test_poller_cut_off_from_zookeeper_stops_firing_and_is_fenced(cassandra_keyspace, zk_root, tmp_path):
    url, client = fleet_setup(cassandra_keyspace)
    out = tmp_path / "fired.log"
    zk_host, _, zk_port = ZOOKEEPER_HOSTS.split(",")[0].partition(":")
    proxy = FaultProxy(zk_host, int(zk_port or 2181))
    zk = f"zookeeper://{ZOOKEEPER_HOSTS}{zk_root}"
    pollers = Pollers(url, out, "--session-timeout", str(SESSION_S))
    producer = Producer(client)
    try:
        due = preload(client, 600, 60, lead_s=4)
        cut_off = pollers.start(1, extra=["--coordinator", f"zookeeper://{proxy.address}{zk_root}",
                                          "--name", "cut-off"])[0]
        pollers.start(1, extra=["--coordinator", zk, "--name", "healthy"])
        producer.start()
        wait_until(lambda: len({r.pid for r in read_records(str(out))}) == 2, 30, "both pollers firing")
        wait_until(lambda: len(owners(zk)[1]) == 8, 20, "every shard owned")
        cut_at = now_ms()
        proxy.cut()
        wait_until(lambda: set(owners(zk)[1].values()) == {"healthy"} and len(owners(zk)[1]) == 8,
                   30, "the healthy poller to own every shard")
        taken_at = now_ms()
        time.sleep(4)
        # Still cut off: a graceful stop writes its checkpoints and clears its owner
        # column, each fenced by the epoch it held: refused, the shards are another's.
        cut_off.terminate()
        cut_off_code = cut_off.wait(timeout=60)
        producer.stop()
        due.update(producer.acked)
        records = wait_fired(out, due, 60)
    finally:
        producer.stop()
        codes = pollers.stop()
        proxy.close()
        client.close()

    lease_end = cut_at + SESSION_S / 2 * 1000
    late = [r for r in records if r.pid == cut_off.pid and r.fired_ms > lease_end + 500]
    window = (cut_at - 3000, max(due.values()) - 2000)
    report = measure("poller cut off from zookeeper", records, due, window=window)
    report.recovery_s = round((taken_at - cut_at) / 1000, 2)
    dups = duplicate_ids(records)
    fired_late_by_cut_off = {r.job_id for r in records
                             if r.pid == cut_off.pid and r.fired_ms >= cut_at - 1000}
    lines = pollers.log_lines()
    refusals = [r for r in lines if r.get("action") in ("fencing_refused", "shard_lost")
                and "epoch" in str(r.get("msg"))]
    report.notes = {"shards_taken_after_s": report.recovery_s, "fired_after_lease": len(late),
                    "fenced_writes_refused": len(refusals), "cut_off_exit": cut_off_code,
                    "exit_codes": codes}
    report.save()
    assert not late, f"the cut-off poller fired after its lease: {late[:3]}"
    assert report.lost == 0 and report.early == 0, report
    # At most what the cut-off poller had running when it was cut off (--concurrency).
    assert dups <= fired_late_by_cut_off and len(dups) <= 16, (sorted(dups)[:5], report)
    assert refusals, "the cut-off poller's later writes were refused by the fencing token"
    assert cut_off_code == 0, report
