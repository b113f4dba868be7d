"""A slow write, injected as latency on the producer's connection only (``FaultProxy``
with ``delay_s``), while a poller with its own connection reads ahead: the producer's
acknowledgements come later than the skew bound allows, so slow-write repair moves the
jobs, after the poller has already queued their old rows. Held: nothing lost or early,
duplicates within the documented bound (at most one per moved job); the
owner drops the retired rows it had queued (it is told, and the store confirms)."""

from __future__ import annotations

import logging
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from scheduler import Client, JobSpec
from scheduler.domain.clock import SystemClock
from scheduler.store import SchemaOptions, open_store
from tests.conftest import CASSANDRA_HOSTS, CASSANDRA_PORT, cassandra_url
from tests.faultload import Pollers, measure, wait_fired
from tests.faultproxy import FaultProxy
from tests.procs import wait_until

pytestmark = pytest.mark.fault
# More than the skew bound (0.5 s), so every write counts as late; less than the room a
# move gets, so each job is moved once.
DELAY_S = 0.6


def test_a_slow_write_is_repaired_without_duplicates(cassandra_keyspace, tmp_path, caplog):
    url = cassandra_url(cassandra_keyspace)
    store = open_store(url)
    store.apply_schema(SchemaOptions(shard_count=4, bucket_width_s=10), SystemClock().now_ms())
    out = tmp_path / "fired.log"
    pollers = Pollers(url, out)
    proxy = FaultProxy(CASSANDRA_HOSTS.split(",")[0], CASSANDRA_PORT)
    client = Client(open_store(url.replace(f":{CASSANDRA_PORT}/", f":{proxy.port}/")))
    try:
        pollers.start(1)
        wait_until(lambda: bool(store.notify_endpoints(SystemClock().now_ms()))
                   and all(c.owner for c in store.checkpoints()), 60, "the poller owns and listens")
        now = datetime.now(UTC)
        client.schedule("warm-up", now + timedelta(minutes=5), "record")  # connected, marks written
        proxy.delay_s = DELAY_S
        with caplog.at_level(logging.WARNING, logger="scheduler.client"):
            jobs = client.schedule_many([JobSpec(f"slow{i}", now + timedelta(milliseconds=20 * i), "record")
                                         for i in range(50)])
        proxy.delay_s = 0.0
        due = {j.job_id: j.due_ms for j in jobs}
        records = wait_fired(out, due, 60, supervise=pollers)
        # Any old row still queued would fire by its placed time: wait until that passed.
        last = max(j.fire_ms for j in jobs) + 2_000
        wait_until(lambda: SystemClock().now_ms() > last, 30, "the last position passed")
    finally:
        proxy.delay_s = 0.0
        codes = pollers.stop()
        client.close()
        proxy.close()
    records = wait_fired(out, due, 0)
    moved = sum(getattr(r, "jobs", 0) for r in caplog.records
                if getattr(r, "action", "") == "slow_write_repaired")
    stopped = [ln for ln in pollers.log_lines() if ln.get("action") == "poller_stopped"]
    dropped = sum(int(str(ln.get("retired_dropped", 0))) for ln in stopped)
    report = measure("producer's writes acknowledged 0.6 s late", records, due,
                     window=(min(due.values()), max(due.values())))
    report.notes = {"moved_jobs": moved, "retired_dropped": dropped, "exit_codes": codes}
    report.save()
    assert moved == 50, report  # the fault happened: every write was late
    assert report.lost == 0 and report.early == 0, report
    per_job = Counter(r.job_id for r in records)
    assert report.duplicates <= moved and max(per_job.values()) <= 2, report  # the bound
    assert codes == [0], report
    store.close()
