"""Recorded firings on both stores: a fired row reads as fired in every read of job state,
and a row written later between fired ones (a write acknowledged late, or one that
reached this DC late) reads as pending and is found by the audit. Cassandra records
firings as batches listing the rows (one row per partition and batch, no fired_at cell
per job); the embedded store sets fired_at per row: the same answers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from scheduler.domain.model import Status
from scheduler.domain.progress import Checkpoint
from scheduler.observe.audit import audit
from scheduler.store import SchemaOptions, Store
from tests.conftest import bucket_job, make_store

T0_MS = 1_800_000_000_000  # a bucket boundary (60 s buckets)
B0 = T0_MS // 1000
END = T0_MS + 59_999


@pytest.fixture
def st(store_kind: str, request: Any, tmp_path: Any) -> Iterator[Store]:
    s = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=2), now_ms=T0_MS)
    yield s
    s.close()


def test_fired_rows_read_fired_everywhere_and_a_row_landing_between_them_reads_pending(st: Store):
    a, b, c, d = (bucket_job(n, T0_MS + i * 1000) for i, n in enumerate("abcd", 1))
    other = bucket_job("o", T0_MS + 1000, shard=1)
    st.insert_many([a, c, d, other])
    st.record_fired([a, c], T0_MS + 3500)
    st.record_fired([c], T0_MS + 4500)  # recorded again (a retried write): the later time
    st.insert_many([b])  # lands between two fired rows, after they fired
    rows = st.read_bucket(B0, 0, None, END, 100)
    assert [(r.job_id, r.status, r.fired_ms) for r in rows] == [
        ("a", Status.FIRED, T0_MS + 3500), ("b", Status.PENDING, None), ("c", Status.FIRED, T0_MS + 4500),
        ("d", Status.PENDING, None)]
    ranges = st.read_buckets([(B0, 0, (a.fire_ms, a.job_id), END), (B0, 1, None, END)], 100)
    assert [[(r.job_id, r.fired_ms is None) for r in rs] for rs in ranges] == [
        [("b", True), ("c", False), ("d", True)], [("o", True)]]
    got = st.get_many(["a", "b", "c", "d", "o"])
    assert {k: j.status for k, j in got.items()} == {
        "a": Status.FIRED, "b": Status.PENDING, "c": Status.FIRED, "d": Status.PENDING, "o": Status.PENDING}
    assert st.pending([(B0, 0, None, END), (B0, 1, None, END)]) == [(2, b.fire_ms), (1, other.fire_ms)]
    assert st.count_pending([(B0, 0, (b.fire_ms, b.job_id), END)]) == [1]
    # Behind a checkpoint, the row that landed late is what the audit calls lost.
    st.record_fired([d, other], T0_MS + 5500)
    st.claim_shard(0, "p0", 5, B0 - 60, T0_MS)
    st.save_checkpoint(0, 5, Checkpoint(B0), T0_MS + 61_000)
    report = audit(st, T0_MS, END)
    assert [v.job_id for v in report.violations] == ["b"]
    assert report.totals()["fired"] == 4


def test_cassandra_lists_firings_in_one_row_per_partition_and_batch(st: Store, store_kind: str):
    if store_kind != "cassandra":
        pytest.skip("how Cassandra stores firings; the embedded store sets fired_at per row")
    jobs = [bucket_job(f"j{i:04d}", T0_MS + i, shard=i % 2) for i in range(1200)]
    st.insert_many(jobs)
    st.record_fired(jobs, T0_MS + 5000)
    session, ks = st.session, st.keyspace  # type: ignore[attr-defined]
    cells = [r[0] for r in session.execute(f"SELECT fired_at FROM {ks}.jobs_by_bucket")]
    assert len(cells) == 1200 and not any(cells), "no fired_at cell per job"
    batches = list(session.execute(f"SELECT bucket, shard, job_ids FROM {ks}.fired_batches"))
    assert sorted(len(r[2]) for r in batches) == [100, 100, 500, 500]  # 600 a shard, 500 a row
    assert all(j.status is Status.FIRED for j in st.get_many([j.job_id for j in jobs]).values())
