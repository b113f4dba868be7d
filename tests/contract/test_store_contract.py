"""Store-level contract: schema management and the bucket read cursor."""

from __future__ import annotations

from scheduler.domain.keys import bucket_of_ms
from scheduler.domain.model import Job
from scheduler.store import SchemaOptions, Store
from scheduler.store.base import SCHEMA_VERSION

T0_MS = 1_800_000_000_000


def row(job_id: str, fire_ms: int, shard: int = 0) -> Job:
    return Job(job_id=job_id, kind="k", data=b"", data_json=False, due_ms=fire_ms,
               fire_ms=fire_ms, bucket=bucket_of_ms(fire_ms, 60), shard=shard)


def test_apply_is_idempotent_and_keeps_settings(store: Store):
    meta = store.meta()
    res = store.apply_schema(SchemaOptions(shard_count=99), T0_MS + 10**9)
    assert not res.created and res.from_version == res.to_version == SCHEMA_VERSION
    assert store.meta() == meta
    assert [lay.shard_count for lay in store.layouts()] == [16]


def test_read_bucket_cursor(store: Store):
    b = bucket_of_ms(T0_MS, 60) * 1000
    jobs = [row("a", b + 100), row("b", b + 100), row("c", b + 5_000), row("d", b + 59_999)]
    store.insert_many(jobs)
    bucket = jobs[0].bucket
    got = store.read_bucket(bucket, 0, None, b + 5_000, 10)
    assert [j.job_id for j in got] == ["a", "b", "c"]
    assert store.read_bucket(bucket, 0, (b + 100, "a"), b + 60_000, 10)[0].job_id == "b"
    assert [j.job_id for j in store.read_bucket(bucket, 0, (b + 5_000, "c"), b + 60_000, 10)] == ["d"]
    assert [j.job_id for j in store.read_bucket(bucket, 0, None, b + 60_000, 2)] == ["a", "b"]
    assert store.read_bucket(bucket, 1, None, b + 60_000, 10) == []
    assert got[0] == jobs[0]


def test_read_buckets_is_read_bucket_for_each_range_in_order(store: Store):
    b = bucket_of_ms(T0_MS, 60) * 1000
    jobs = [row("a", b + 100), row("b", b + 200), row("c", b + 300, shard=1), row("d", b + 400, shard=1)]
    store.insert_many(jobs)
    bucket = jobs[0].bucket
    parts = [(bucket, 1, None, b + 60_000), (bucket, 0, (b + 100, "a"), b + 60_000), (bucket, 2, None, b + 1)]
    got = store.read_buckets(parts, 10)
    assert [[j.job_id for j in rows] for rows in got] == [["c", "d"], ["b"], []]
    assert [[j.job_id for j in rows] for rows in store.read_buckets(parts[:1], 1)] == [["c"]]
    assert store.read_buckets([], 10) == []


def test_marks_only_grow(store: Store):
    origin = store.layouts().latest.from_bucket
    store.insert_mark(origin, 7200 + origin)
    store.insert_mark(origin, 3600 + origin)
    assert store.layouts().latest.mark_end == 7200 + origin


def test_insert_layout_once(store: Store):
    from scheduler.domain.layout import Layout

    lay = Layout(store.layouts().latest.from_bucket + 6000, 8, T0_MS)
    assert store.insert_layout(lay) is True
    assert store.insert_layout(Layout(lay.from_bucket, 32, T0_MS)) is False
    assert [x.shard_count for x in store.layouts()] == [16, 8]


def test_server_clock_is_close(store: Store):
    import time

    assert abs(store.server_now_ms() - time.time() * 1000) < 5_000


def test_insert_once_never_undoes_a_change(store: Store):
    """A rewrite of an occurrence (a poller that crashed re-reads its predecessor) keeps
    whatever happened to it: fired, retried elsewhere, or cancelled."""
    b = bucket_of_ms(T0_MS, 60) * 1000
    written = T0_MS - 120_000  # before any change, as the client dates them
    fired, retried, cancelled, fresh = (row(n, b + 1_000 + i) for i, n in enumerate("frcn"))
    store.insert_once([fired, retried, cancelled], written)
    store.record_fired([fired], b + 2_000)
    later = retried.evolve(fire_ms=b + 30_000, attempts=1)
    store.record_retry(retried, later, "boom", b + 2_000)
    store.cancel(cancelled)
    store.insert_once([fired, retried, cancelled, fresh], written)
    got = store.get_many(["f", "r", "c", "n"])
    assert got["f"].status.value == "fired" and got["f"].fired_ms == b + 2_000
    assert got["r"].status.value == "pending" and got["r"].fire_ms == b + 30_000
    assert got["r"].attempts == 1 and got["r"].last_error == "boom"
    assert got["c"].status.value == "cancelled"
    assert got["n"] == fresh
    rows = store.read_bucket(fired.bucket, 0, None, b + 60_000, 10)
    due = [(j.job_id, j.fire_ms) for j in rows if j.fired_ms is None]
    assert due == [("n", b + 1_003), ("r", b + 30_000)], "only the new one and the retry are left to fire"


def test_get_many_reads_any_number_of_ids_with_repeats_and_missing_ones(store: Store):
    jobs = [row(f"g{i}", T0_MS + i) for i in range(600)]
    store.insert_once(jobs, T0_MS - 120_000)
    asked = [f"g{i}" for i in range(0, 600, 2)] + ["g0", "missing", "g599", "g599"] * 3
    got = store.get_many(asked)
    assert set(got) == {f"g{i}" for i in range(0, 600, 2)} | {"g599"}
    assert all(got[j].job_id == j and got[j].fire_ms == T0_MS + int(j[1:]) for j in got)
    assert store.get_many([]) == {}
