"""The completeness audit on both stores: each row counted by outcome, and a row written
straight into the store behind a checkpoint (what a lost job looks like) flagged, alone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from scheduler.domain.model import Status
from scheduler.domain.progress import Checkpoint
from scheduler.observe.audit import audit, classify, passed
from scheduler.store import SchemaOptions, Store
from scheduler.store.base import ShardCheckpoint
from tests.conftest import bucket_job, make_store

T0_MS = 1_800_000_000_000  # a bucket boundary (60 s buckets)
B0 = T0_MS // 1000
S = 2


@pytest.fixture
def st(store_kind: str, request: Any, tmp_path: Any) -> Iterator[Store]:
    s = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=S), now_ms=T0_MS)
    yield s
    s.close()


job = bucket_job


def test_counts_by_outcome_and_flags_exactly_the_lost_row(st: Store):
    fired, cancelled, moved, lost = (job("fired", T0_MS + 1000), job("cancelled", T0_MS + 2000),
                                     job("moved", T0_MS + 3000), job("lost", T0_MS + 4000))
    ahead = job("ahead", T0_MS + 65_000)  # in the next bucket, ahead of the checkpoint
    other = job("other", T0_MS + 5000, shard=1)  # shard 1 has no checkpoint: nothing passed
    st.insert_many([fired, cancelled, moved, ahead, other])
    st.record_fired([fired], T0_MS + 1500)
    st.cancel(cancelled)
    st.move(moved, job("moved", T0_MS + 70_000))
    st.claim_shard(0, "p0", 5, B0 - 60, T0_MS)
    st.save_checkpoint(0, 5, Checkpoint(B0), T0_MS + 61_000)  # bucket B0 drained
    # Written behind the checkpoint, as no producer can: a lost job.
    st.insert_many([lost])

    report = audit(st, T0_MS, T0_MS + 119_999)
    assert report.totals() == {"written": 7, "fired": 1, "cancelled": 1, "dead": 0, "moved": 1,
                               "pending": 4}
    assert [(v.job_id, v.bucket, v.shard) for v in report.violations] == [("lost", B0, 0)]
    by_part = {(p.bucket, p.shard): p for p in report.partitions}
    assert len(by_part) == 4 and by_part[(B0, 0)].written == 4 and by_part[(B0 + 60, 0)].pending == 2
    assert report.as_dict()["violations"][0]["job_id"] == "lost"


def test_a_range_with_nothing_written_is_clean(st: Store):
    seen: list[tuple[int, int]] = []
    report = audit(st, T0_MS, T0_MS + 59_999, progress=lambda done, total: seen.append((done, total)))
    assert report.totals()["written"] == 0 and not report.violations
    assert seen == [(S, S)]


def test_the_pure_rules():
    row = job("a", T0_MS + 1000)
    cp = ShardCheckpoint(0, B0 - 60, (T0_MS + 1000, "a"), "p", 1, None)
    assert passed(cp, row, 60) and not passed(None, row, 60)
    assert not passed(ShardCheckpoint(0, B0 - 60, (T0_MS + 999, "z"), "p", 1, None), row, 60)
    assert passed(ShardCheckpoint(0, B0, None, "p", 1, None), row, 60)
    assert classify(row, None) == "pending"
    assert classify(row._replace(fired_ms=1), row._replace(status=Status.FIRED)) == "fired"
    assert classify(row._replace(fired_ms=1), row._replace(status=Status.DEAD)) == "dead"
    assert classify(row._replace(fired_ms=1), row._replace(fire_ms=T0_MS + 9000)) == "moved"


def test_the_exporter_audits_the_last_closed_hour_and_exports_the_violations(st: Store):
    from prometheus_client import generate_latest

    from scheduler.domain.clock import FakeClock
    from scheduler.observe.exporter import LagExporter
    from tests.contract.test_observe_contract import parse_metrics

    st.claim_shard(0, "p0", 5, B0 - 60, T0_MS)
    st.save_checkpoint(0, 5, Checkpoint(B0), T0_MS + 61_000)
    st.insert_many([job("lost", T0_MS + 4000), job("fine", T0_MS + 90_000)])
    # Ten minutes into the next hour: the closed hour is the one starting at T0 (an hour boundary).
    exp = LagExporter(st, FakeClock(T0_MS + 4_200_000), audit_interval_s=600)
    assert "scheduler_audit_violations" not in generate_latest(exp.registry).decode()
    report = exp.run_audit()
    assert (report.from_bucket, report.to_bucket) == (B0, B0 + 3540)
    m = parse_metrics(generate_latest(exp.registry))
    assert m["scheduler_audit_violations"] == 1
    assert m['scheduler_audit_jobs{outcome="written"}'] == 2
    assert m['scheduler_audit_jobs{outcome="pending"}'] == 2
    assert m["scheduler_audit_errors_total"] == 0


def test_a_lookup_row_pointing_at_no_bucket_row_is_flagged(st: Store):
    from scheduler.store.cassandra.store import CassandraStore

    a, kept = job("gone", T0_MS + 1000), job("kept", T0_MS + 2000)
    st.insert_many([a, kept])
    target = job("gone", T0_MS + 3_600_000)  # moved an hour on, out of the audited range
    st.move(a, target)
    st.move(kept, job("kept", T0_MS + 3_600_000))
    # The bucket row the lookup row now names vanishes, as no code path here can do.
    key = (target.bucket, target.shard, target.fire_ms, target.job_id)
    if isinstance(st, CassandraStore):
        st.session.execute(f"DELETE FROM {st.keyspace}.jobs_by_bucket WHERE bucket = %s AND shard = %s "
                           "AND fire_at = %s AND job_id = %s", (key[0], key[1], key[2], key[3]))
    else:
        st._db.execute("DELETE FROM jobs_by_bucket WHERE bucket = ? AND shard = ? AND fire_at = ? "  # type: ignore[attr-defined]
                       "AND job_id = ?", key)
    report = audit(st, T0_MS, T0_MS + 59_999)
    assert report.totals()["moved"] == 2
    assert [(v.job_id, v.bucket, v.reason) for v in report.violations] == [
        ("gone", target.bucket, "its lookup row points at no bucket row")]


def test_the_lookup_scan_finds_a_lookup_row_whose_bucket_row_is_missing(st: Store):
    from scheduler.store.cassandra.store import CassandraStore

    lost, fine = job("no-row", T0_MS + 1000), job("fine", T0_MS + 2000)
    st.insert_many([lost, fine, job("later", T0_MS + 7_200_000)])
    key = (lost.bucket, lost.shard, lost.fire_ms, lost.job_id)
    if isinstance(st, CassandraStore):
        st.session.execute(f"DELETE FROM {st.keyspace}.jobs_by_bucket WHERE bucket = %s AND shard = %s "
                           "AND fire_at = %s AND job_id = %s", key)
    else:
        st._db.execute("DELETE FROM jobs_by_bucket WHERE bucket = ? AND shard = ? AND fire_at = ? "  # type: ignore[attr-defined]
                       "AND job_id = ?", key)
    assert audit(st, T0_MS, T0_MS + 59_999).violations == []  # the bucket side cannot see it
    report = audit(st, T0_MS, T0_MS + 59_999, lookups=True)
    assert [(v.job_id, v.reason) for v in report.violations] == [
        ("no-row", "its lookup row points at no bucket row")]
