"""What operators read: due-backlog counts, lag, forecasts, bucket rows and the lag
exporter. Same tests on SQLite and Cassandra."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import generate_latest

from scheduler.domain.clock import FakeClock
from scheduler.domain.keys import bucket_of_ms
from scheduler.domain.model import Job, Status
from scheduler.domain.progress import Checkpoint
from scheduler.errors import SchedulerError
from scheduler.fleet.view import FleetSnapshot
from scheduler.observe.exporter import LagExporter
from scheduler.observe.lag import bucket_rows, fleet_status, forecast, lag_report
from scheduler.store import SchemaOptions, Store
from tests.conftest import make_store

T0_MS = 1_800_000_000_000  # a bucket boundary: 1_800_000_000 is a multiple of 60
B0 = T0_MS // 1000
S = 4


@pytest.fixture
def st(store_kind: str, request: Any, tmp_path: Any) -> Iterator[Store]:
    s = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=S), now_ms=T0_MS)
    yield s
    s.close()


def job(job_id: str, fire_ms: int, shard: int) -> Job:
    return Job(job_id=job_id, kind="k", data=b"{}", data_json=True, due_ms=fire_ms,
               fire_ms=fire_ms, bucket=bucket_of_ms(fire_ms, 60), shard=shard)


def parse_metrics(text: bytes) -> dict[str, float]:
    out = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_count_pending_skips_fired_rows_and_respects_cursor_and_until(st: Store):
    rows = [job(f"j{i}", T0_MS + i * 1000, 1) for i in range(10)]
    st.insert_many(rows)
    st.record_fired(rows[:3], T0_MS + 5_000)
    assert st.count_pending([(B0, 1, None, T0_MS + 59_999)]) == [7]
    assert st.count_pending([(B0, 1, (T0_MS + 4000, "j4"), T0_MS + 59_999)]) == [5]
    assert st.count_pending([(B0, 1, None, T0_MS + 5000), (B0, 2, None, T0_MS + 59_999),
                             (B0 + 60, 1, None, T0_MS + 119_999)]) == [3, 0, 0]
    # The oldest pending row of each part comes with its count.
    assert st.pending([(B0, 1, None, T0_MS + 59_999), (B0, 2, None, T0_MS + 59_999)]) == [
        (7, T0_MS + 3000), (0, None)]


def test_lag_report_worst_first_with_backlog_and_owners(st: Store):
    now = T0_MS + 10 * 60_000 + 30_000  # ten and a half minutes after the origin bucket
    # Shard 0 is drained up to 9 minutes; shard 1 stopped after the origin bucket with a
    # cursor; shards 2 and 3 never had an owner.
    st.claim_shard(0, "p0", 5, B0 - 60, T0_MS)
    st.save_checkpoint(0, 5, Checkpoint(B0 + 8 * 60), now)
    st.claim_shard(1, "p1", 6, B0 - 60, T0_MS)
    st.save_checkpoint(1, 6, Checkpoint(B0, (T0_MS + 61_000, "c1")), now)
    st.insert_many([job("c1", T0_MS + 61_000, 1), job("c2", T0_MS + 62_000, 1),
                    job("c3", T0_MS + 5 * 60_000, 1), job("future", now + 60_000, 1),
                    job("d1", T0_MS + 1_000, 2)])
    rows = lag_report(st, now)
    assert [r.shard for r in rows] == [2, 3, 1, 0]  # equal lag: the larger backlog first
    by = {r.shard: r for r in rows}
    assert by[0].lag_s == 90.0 and by[0].owner == "p0" and by[0].backlog == 0
    assert by[1].lag_s == 9 * 60 + 30 and by[1].backlog == 2  # c1 is behind the cursor
    assert by[2].lag_s == 10 * 60 + 30 and by[2].backlog == 1 and by[2].owner is None
    # ZooKeeper's view of owners replaces the column (p1 died; its row still names it).
    fleet = FleetSnapshot(["p0"], {0: "p0"})
    assert {r.shard: r.owner for r in lag_report(st, now, fleet)} == {0: "p0", 1: None, 2: None, 3: None}
    capped = {r.shard: r for r in lag_report(st, now, max_scan_buckets=2)}
    assert capped[1].backlog_capped and capped[1].backlog == 1 and not capped[0].backlog_capped
    status = fleet_status(st, now, fleet)
    assert status.shards_per_owner == {"p0": [0]} and status.unowned == [1, 2, 3]
    assert status.worst is not None and status.worst.shard == 2


def test_forecast_counts_pending_jobs_per_bucket_and_shard(st: Store):
    now = T0_MS + 30_000
    jobs = [job(f"f{i}", T0_MS + i * 20_000, i % S) for i in range(12)]  # 4 minutes, 3 a minute
    st.insert_many([*jobs, job("far", T0_MS + 5 * 3_600_000, 0)])
    st.record_fired(jobs[:1], now)
    fc = forecast(st, now, hours=0.05)  # 3 minutes ahead: buckets B0 .. B0 + 180
    assert fc.per_bucket == {B0: 2, B0 + 60: 3, B0 + 120: 3, B0 + 180: 3}
    assert fc.total == 11 and sum(fc.per_shard.values()) == 11
    assert fc.cells[(B0 + 60, 3)] == 1


def test_bucket_rows_include_fired_rows(st: Store):
    a, b = job("a", T0_MS + 1000, 0), job("b", T0_MS + 2000, 3)
    st.insert_many([a, b])
    st.record_fired([a], T0_MS + 1500)
    rows = {j.job_id: j for j in bucket_rows(st, B0, None)}
    assert set(rows) == {"a", "b"} and rows["a"].fired_ms == T0_MS + 1500
    assert [j.job_id for j in bucket_rows(st, B0, 3)] == ["b"]


def test_bucket_rows_show_a_cancelled_row_as_cancelled(st: Store):
    c = job("c", T0_MS + 3000, 1)
    st.insert_many([c])
    st.cancel(c)
    (row,) = bucket_rows(st, B0, 1)
    assert row.job_id == "c" and row.status is Status.CANCELLED


def test_exporter_lag_keeps_growing_when_reads_fail(st: Store):
    clock = FakeClock(T0_MS + 90_000)
    st.claim_shard(0, "p0", 5, B0 - 60, T0_MS)
    st.save_checkpoint(0, 5, Checkpoint(B0), T0_MS + 90_000)
    st.insert_many([job("due", T0_MS + 70_000, 2)])
    exp = LagExporter(st, clock, lambda: FleetSnapshot(["p0"], {0: "p0"}))
    exp.refresh()
    m = parse_metrics(generate_latest(exp.registry))
    assert m['scheduler_shard_lag_seconds{shard="0"}'] == 30.0
    assert m['scheduler_shard_owned{shard="0"}'] == 1 and m['scheduler_shard_owned{shard="2"}'] == 0
    assert m['scheduler_shard_due_backlog{shard="2"}'] == 1
    # Due at +70 s, read at +90 s: 20 s overdue; a shard with nothing due shows 0.
    assert m['scheduler_shard_oldest_due_seconds{shard="2"}'] == 20.0
    assert m['scheduler_shard_oldest_due_seconds{shard="0"}'] == 0.0
    assert m["scheduler_exporter_up"] == 1 and m["scheduler_fleet_pollers"] == 1
    assert m["scheduler_layout_shards"] == S
    st.close()
    clock.advance(45)
    with pytest.raises(SchedulerError):
        exp.refresh()
    m = parse_metrics(generate_latest(exp.registry))
    assert m['scheduler_shard_lag_seconds{shard="0"}'] == 75.0
    assert m["scheduler_exporter_up"] == 0 and m["scheduler_exporter_refresh_errors_total"] == 1
