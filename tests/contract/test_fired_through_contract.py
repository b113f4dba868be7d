"""Fired-through marks on both stores: a mark records every row of its partition up to
its key that has no fired_at of its own, for every read of job state; and a poller
draining in order records its firings with marks, not one fired_at per job, without
changing what a new owner fires."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from scheduler import Client, JobSpec
from scheduler.domain.clock import FakeClock
from scheduler.domain.model import Status
from scheduler.poller import PollerConfig
from scheduler.store import SchemaOptions, Store
from tests.conftest import bucket_job, make_store
from tests.contract.test_poller_contract import T0, T0_MS, Recorder, drive, make_poller

B0 = T0_MS // 1000


@pytest.fixture
def st(store_kind: str, request: Any, tmp_path: Any) -> Iterator[Store]:
    s = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=4), now_ms=T0_MS - 60_000)
    yield s
    s.close()


def test_a_mark_fires_the_unmarked_rows_up_to_its_key_in_every_read(st: Store):
    a, b, c, d = (bucket_job(n, T0_MS + i * 1000) for i, n in enumerate("abcd", 1))
    other = bucket_job("o", T0_MS + 1000, shard=1)
    st.insert_many([a, b, c, d, other])
    st.record_fired([b], T0_MS + 2500)
    st.record_fired_through([(B0, 0, (c.fire_ms, c.job_id))], T0_MS + 3500)
    rows = st.read_bucket(B0, 0, None, T0_MS + 59_999, 100)
    assert [(r.job_id, r.fired_ms) for r in rows] == [
        ("a", T0_MS + 3500), ("b", T0_MS + 2500), ("c", T0_MS + 3500), ("d", None)]
    end = T0_MS + 59_999
    ranges = st.read_buckets([(B0, 0, (a.fire_ms, a.job_id), end), (B0, 1, None, end)], 100)
    assert [[r.job_id for r in rs if r.fired_ms is None] for rs in ranges] == [["d"], ["o"]]
    got = st.get_many(["a", "c", "d", "o"])
    assert {k: (j.status, j.fired_ms) for k, j in got.items()} == {
        "a": (Status.FIRED, T0_MS + 3500), "c": (Status.FIRED, T0_MS + 3500),
        "d": (Status.PENDING, None), "o": (Status.PENDING, None)}
    assert st.pending([(B0, 0, None, T0_MS + 59_999), (B0, 1, None, T0_MS + 59_999)]) == [
        (1, d.fire_ms), (1, other.fire_ms)]
    # A later mark covers more; an earlier one written after it (a stale owner's) moves nothing back.
    st.record_fired_through([(B0, 0, (d.fire_ms, d.job_id))], T0_MS + 4500)
    st.record_fired_through([(B0, 0, (a.fire_ms, a.job_id))], T0_MS + 5500)
    assert st.count_pending([(B0, 0, None, T0_MS + 59_999)]) == [0]
    got = st.get_many(["a", "d"])
    assert got["d"].fired_ms == T0_MS + 4500 and got["a"].fired_ms == T0_MS + 5500
    # Past the last mark, a row is pending.
    e = bucket_job("e", T0_MS + 9000)
    st.insert_many([e])
    assert st.get_many(["e"])["e"].status is Status.PENDING


def test_an_in_order_drain_is_recorded_by_marks_and_a_new_owner_fires_none_of_it_again(st: Store):
    clock = FakeClock(T0_MS)
    client = Client(st, clock=clock)
    client.schedule_many([JobSpec(f"r{i}", T0 + timedelta(seconds=5, milliseconds=i * 50), "k")
                          for i in range(200)])
    one_by_one: list[int] = []
    real = st.record_fired

    def counting(jobs: Any, fired_ms: int) -> None:
        one_by_one.append(len(jobs))
        real(jobs, fired_ms)

    st.record_fired = counting  # type: ignore[method-assign]
    first = Recorder(clock)
    # Checkpoints far apart: the new owner below starts where the first one began.
    p1 = make_poller(st, clock, first, config=PollerConfig(checkpoint_interval_s=3600, check_clock=False,
                                                           layout_refresh_s=0, read_limit=50))
    drive(p1, clock, 20)
    fired = {c[0] for c in first.calls}
    assert fired == {f"r{i}" for i in range(200)}
    assert sum(one_by_one) == 0, "no fired_at written one job at a time"
    got = st.get_many(sorted(fired))
    assert all(j.status is Status.FIRED and j.fired_ms is not None and j.fired_ms >= j.due_ms
               for j in got.values())
    assert not any(c.done_cursor for c in st.checkpoints()), "no checkpoint passed a fired row"
    second = Recorder(clock)
    p2 = make_poller(st, clock, second, epoch=2)
    drive(p2, clock, 5)
    assert second.calls == [], "the marks tell the new owner what fired"
