"""Fault: the single Cassandra node stopped for 30 s and started again while producers,
pollers and the exporter run (issue 12, fault 2).

Runs last among the single-node tests (``pytest_collection_modifyitems`` in conftest
orders the fault tests after the rest): it stops the node every other test uses, and
starts it again whatever happens.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request

import pytest

from scheduler import Client
from scheduler.domain.clock import SystemClock
from scheduler.domain.keys import shard_of
from scheduler.store import SchemaOptions, open_store
from tests.conftest import ZOOKEEPER_HOSTS, cassandra_url
from tests.faultload import Pollers, Producer, measure, now_ms, preload, wait_fired, worst_inversion
from tests.procs import ROOT, free_port

pytestmark = pytest.mark.fault
OPS = ROOT / "ops" / "cassandra"
OUTAGE_S = 30
# Jobs that started within this of each other were handed out together (see the test).
TOGETHER_MS = 50


def exporter_up(port: int) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    m = re.search(r"^scheduler_exporter_up (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_single_node_stopped_30s_and_started(cassandra_keyspace, zk_root, tmp_path):
    url = cassandra_url(cassandra_keyspace)
    store = open_store(url)
    store.apply_schema(SchemaOptions(shard_count=8, bucket_width_s=10), SystemClock().now_ms())
    client = Client(store)
    out = tmp_path / "fired.log"
    zk = f"zookeeper://{ZOOKEEPER_HOSTS}{zk_root}"
    pollers = Pollers(url, out, "--coordinator", zk, "--session-timeout", "6")
    port = free_port()
    with open(tmp_path / "exporter.log", "wb") as exporter_log:
        exporter = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "exporter", "--address", f"127.0.0.1:{port}",
             "--interval", "1", "--store", url], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=exporter_log)
    producer = Producer(client)
    stopped = False
    try:
        # Due all through the test, outage included: a pause in firing shows as a gap.
        due = preload(client, 900, 90, lead_s=4)
        pollers.start(2)
        producer.start()
        time.sleep(10)
        assert exporter_up(port) == 1.0, (tmp_path / "exporter.log").read_text()
        stop_at = now_ms()
        subprocess.run([str(OPS), "stop"], check=True, capture_output=True, timeout=60)
        stopped = True
        ups = []
        t_end = time.monotonic() + OUTAGE_S
        while time.monotonic() < t_end:
            ups.append(exporter_up(port))
            pollers.supervise()
            time.sleep(1)
        subprocess.run([str(OPS), "start"], check=True, capture_output=True, timeout=180)
        stopped = False
        back_at = now_ms()
        time.sleep(8)
        producer.stop()
        assert pollers.running() and not pollers.crashes, "no poller exits or crashes"
        deadline = time.monotonic() + 30
        while exporter_up(port) != 1.0 and time.monotonic() < deadline:
            time.sleep(0.5)
        up_again = exporter_up(port)
        due.update(producer.acked)
        records = wait_fired(out, due, 90, supervise=pollers)
    finally:
        producer.stop()
        if stopped:
            subprocess.run([str(OPS), "start"], capture_output=True, timeout=180)
        codes = pollers.stop()
        exporter.terminate()
        exporter.wait(timeout=10)
        client.close()
        store.close()

    window = (stop_at - 3000, max(due.values()) - 2000)
    report = measure("cassandra single node stopped 30 s", records, due, window=window,
                     recovered_at_ms=back_at)
    logs = pollers.log_lines()
    warnings = [r for r in logs if r.get("level") in ("warning", "error")]
    failing = [r for r in logs if r.get("action") == "store_failing"]
    # What fell due during the outage fires after it, oldest first within each shard
    # (the release heap orders by fire time). Handlers handed out together start on
    # different worker threads in any order: when a shard's whole backlog is read at once
    # (a shard claimed seconds after the store came back), two of them started 1 ms apart
    # with due times 24 s apart. So only a job that started more than TOGETHER_MS after a
    # later-due one of its shard counts as out of order.
    # Only the preloaded jobs: the producer's retried calls place a job whose due time
    # passed during the outage at now + late margin, after the outage, by design.
    catch_up: dict[int, list[tuple[int, int]]] = {}
    for r in records:
        if r.job_id.startswith("pre") and stop_at <= r.due_ms < back_at <= r.fired_ms:
            catch_up.setdefault(shard_of(r.job_id, 8), []).append((r.fired_ms, r.due_ms))
    worst_inversion_ms = max((worst_inversion(pairs, TOGETHER_MS) for pairs in catch_up.values()), default=0)
    report.notes = {"producer_errors": len(producer.errors),
                    "caught_up": sum(map(len, catch_up.values())),
                    "worst_inversion_ms": worst_inversion_ms,
                    "producer_error_types": sorted({t for _, t, _ in producer.errors}),
                    "retried_ok": producer.retried_ok, "warning_lines": len(warnings),
                    "store_failing_lines": len(failing), "exit_codes": codes,
                    "exporter_up_during": sorted({u for u in ups if u is not None}),
                    "outage_s": round((back_at - stop_at) / 1000, 1)}
    report.save()
    assert report.lost == 0, report
    assert report.early == 0, report
    # Jobs fired while the store was away whose outcome was not yet written when the
    # fleet handed their shards back: at most the prefetch window's jobs (2 s) per poller.
    assert report.duplicates <= 2 * 2 * 15, report
    assert report.recovery_s is not None and report.recovery_s <= 10, report
    assert codes == [0, 0], report
    # Logged once per poller and spell, summarised at most every 30 s, never per job.
    assert len(failing) <= 4, [r.get("msg") for r in failing]
    assert len(warnings) <= 60, [r.get("msg") for r in warnings[:80]]
    assert producer.errors, "the producer saw the outage"
    assert {t for _, t, _ in producer.errors} <= {"StoreUnavailable", "WriteTimeout"}, producer.errors[:3]
    assert all("\n" not in m for _, _, m in producer.errors)
    assert producer.retried_ok >= 1, "a retried schedule succeeded once the store was back"
    assert 0.0 in ups, f"scheduler_exporter_up never dropped to 0: {ups}"
    assert up_again == 1.0
    assert catch_up and worst_inversion_ms <= 1000, report
