"""FastBinder against a real Cassandra: the bytes it appends are the driver's own, the
rows it writes read back, and a wrong value fails before anything is sent."""

from __future__ import annotations

from datetime import datetime

import pytest
from cassandra.query import BatchStatement, BatchType

from bench.fastbind import FastBinder
from scheduler.domain.model import Job
from scheduler.store import SchemaOptions, open_store
from scheduler.store.cassandra.store import CassandraStore
from scheduler.store.rows import bucket_params
from tests.conftest import cassandra_url

T0_MS = 1_800_000_000_000


@pytest.fixture
def cstore(cassandra_keyspace):
    store = open_store(cassandra_url(cassandra_keyspace))
    assert isinstance(store, CassandraStore)
    store.apply_schema(SchemaOptions(shard_count=4), T0_MS)
    yield store
    store.close()


def _rows(n: int) -> list[tuple[object, ...]]:
    naive = datetime(2027, 1, 15, 9, 30, 1, 123000)  # the driver's own timestamp type
    return [(3600, T0_MS + 7, T0_MS // 1000, 2, T0_MS + i, f"job-{i}") for i in range(n - 1)] + [
        (60, naive, T0_MS // 1000, 2, None, "job-last")]


def test_same_values_as_the_drivers_bind(cstore):
    stmt = cstore.prepared("mark_fired")
    rows = _rows(6)
    slow = BatchStatement(batch_type=BatchType.UNLOGGED)
    for params in rows:
        slow.add(stmt, params)
    fast = FastBinder(stmt)
    assert fast.usable
    batch = fast.batch(rows)
    assert batch._statements_and_parameters == slow._statements_and_parameters
    assert batch.routing_key == slow.routing_key and batch.keyspace == slow.keyspace


def test_fallback_path_gives_the_same_batch(cstore):
    stmt = cstore.prepared("mark_fired")
    fast = FastBinder(stmt)
    fast.usable = False
    rows = _rows(3)
    slow = BatchStatement(batch_type=BatchType.UNLOGGED)
    for params in rows:
        slow.add(stmt, params)
    assert fast.batch(rows)._statements_and_parameters == slow._statements_and_parameters


def test_wrong_values_raise_before_sending(cstore):
    fast = FastBinder(cstore.prepared("mark_fired"))
    good = (60, T0_MS, T0_MS // 1000, 1, T0_MS, "a")
    with pytest.raises(ValueError, match="expected 6 values"):
        fast.batch([good, (60, T0_MS, T0_MS // 1000)])
    with pytest.raises(TypeError):
        fast.batch([good, (60, T0_MS, "not a bucket", 1, T0_MS, "b")])


def test_record_fired_marks_every_row(cstore):
    """Many jobs in one partition (several batches) plus a lone one in another."""
    bucket = T0_MS // 1000 // 60 * 60
    jobs = [Job(job_id=f"j{i}", kind="k", data=b"{}", data_json=True, due_ms=bucket * 1000 + i,
                fire_ms=bucket * 1000 + i, bucket=bucket, shard=1) for i in range(120)]
    lone = Job(job_id="lone", kind="k", data=b"{}", data_json=True, due_ms=bucket * 1000,
               fire_ms=bucket * 1000, bucket=bucket, shard=3)
    stmt = cstore.prepared("insert_bucket_row")
    for job in [*jobs, lone]:
        cstore.session.execute(stmt, (*bucket_params(job), cstore.job_ttl(job)))
    cstore.record_fired([*jobs, lone], T0_MS + 999)
    for shard, expect in ((1, 120), (3, 1)):
        rows = cstore.read_bucket(bucket, shard, None, bucket * 1000 + 60_000, 1000)
        assert len(rows) == expect
        assert {r.fired_ms for r in rows} == {T0_MS + 999}
