"""The due queue's key index against a plain list model: after any sequence of pushes,
pops (with and without rate bounds, so jobs park), finds and discards, ``find``,
``discard_many``, ``discard_shard``, ``len`` and ``drain`` agree with a list of the queued
jobs scanned linearly, and nothing leaves before its time. Many entries: the stale heap
entries left by discards are compacted along the way."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.domain.clock import FakeClock
from scheduler.domain.model import Job
from scheduler.poller.duequeue import DueQueue


def job(n: int, fire_ms: int, shard: int) -> Job:
    return Job(job_id=f"j{n}", kind="k", data=b"", data_json=False, due_ms=fire_ms, fire_ms=fire_ms,
               bucket=0, shard=shard)


# Few ids and times, so pushes repeat keys, discards hit, and times tie.
ids = st.integers(0, 40)
times = st.integers(0, 50)
keys = st.lists(st.tuples(times, ids), max_size=6)
push = st.tuples(st.just("push"), ids, times, st.integers(0, 2), st.booleans())
pop = st.tuples(st.just("pop"), times, st.integers(0, 8))
ops = st.one_of(
    push, push, push, pop, pop,  # mostly pushes and pops, so shards over their rate park jobs
    st.tuples(st.just("find"), keys),
    st.tuples(st.just("discard"), keys),
    st.tuples(st.just("shard"), st.integers(0, 2)),
    st.tuples(st.just("advance"), st.floats(0, 2)),
)


def check(q: DueQueue, model: list[tuple[int, Job]]) -> None:
    assert len(q) == len(model)
    everything = [(j.fire_ms, j.job_id) for _, j in model]
    assert q.find(everything) == {(j.fire_ms, j.job_id): j for _, j in model}


@pytest.mark.fuzz
@given(rates=st.sampled_from([(None, None), (None, 2.0), (5.0, 1.0)]),
       script=st.lists(ops, min_size=10, max_size=120))
def test_the_index_agrees_with_a_list_of_the_queued_jobs(rates: tuple[Any, Any], script: list[Any]):
    clock = FakeClock()
    q = DueQueue(*rates, monotonic=clock.monotonic)
    model: list[tuple[int, Job]] = []  # (leaves at ms, job), what the queue holds
    latest = 0
    for op in script:
        if op[0] == "push":
            _, n, t, shard, early = op
            j = job(n, t + 5, shard)
            at = t if early else None
            model = [(a, m) for a, m in model if (m.fire_ms, m.job_id) != (j.fire_ms, j.job_id)]
            model.append((j.fire_ms if at is None else at, j))
            q.push(j, at)
        elif op[0] == "pop":
            _, now, n = op
            leaves = {id(m): a for a, m in model}
            due = sorted((a, m.job_id) for a, m in model if a <= now)
            out = q.pop_ready(now, n)
            latest = max(latest, now)  # a parked job was due at an earlier call's time
            assert len(out) <= n
            for j in out:
                assert id(j) in leaves and leaves[id(j)] <= latest, "left before its time, or not queued"
            if rates == (None, None):  # no bound: the oldest due jobs leave, in order
                assert [(leaves[id(j)], j.job_id) for j in out] == due[:n]
            popped = {id(j) for j in out}
            model = [(a, m) for a, m in model if id(m) not in popped]
        elif op[0] == "find":
            wanted = set(op[1])
            assert q.find(wanted) == {(m.fire_ms, m.job_id): m for _, m in model
                                      if (m.fire_ms, m.job_id) in wanted}
        elif op[0] == "discard":
            wanted = set(op[1])
            dropped = q.discard_many(wanted)
            expected = [m for _, m in model if (m.fire_ms, m.job_id) in wanted]
            assert sorted(j.job_id for j in dropped) == sorted(m.job_id for m in expected)
            model = [(a, m) for a, m in model if (m.fire_ms, m.job_id) not in wanted]
        elif op[0] == "shard":
            dropped = q.discard_shard(op[1])
            assert sorted(j.job_id for j in dropped) == sorted(m.job_id for _, m in model if m.shard == op[1])
            model = [(a, m) for a, m in model if m.shard != op[1]]
        else:
            clock.advance(op[1])
        check(q, model)
    assert sorted(j.job_id for j in q.drain()) == sorted(m.job_id for _, m in model)
    assert len(q) == 0 and q.find([(m.fire_ms, m.job_id) for _, m in model]) == {}


def test_many_entries_find_and_discard_stay_consistent():
    q = DueQueue()
    jobs = [job(n, n % 997, n % 4) for n in range(20_000)]
    for j in jobs:
        q.push(j)
    gone = {(j.fire_ms, j.job_id) for j in jobs[::3]}
    assert len(q.discard_many(gone)) == len(gone)
    assert q.find(gone) == {}
    kept = [j for j in jobs if (j.fire_ms, j.job_id) not in gone]
    assert q.find([(j.fire_ms, j.job_id) for j in kept]) == {(j.fire_ms, j.job_id): j for j in kept}
    assert q.discard("j1", 1) is jobs[1] and q.discard("j1", 1) is None
    out = q.pop_ready(10_000, 100_000)
    assert [(j.fire_ms, j.job_id) for j in out] == sorted((j.fire_ms, j.job_id) for j in kept[1:])
    assert len(q) == 0


def test_parked_jobs_are_found_discarded_and_popped_through_the_index():
    clock = FakeClock()
    q = DueQueue(shard_rate=1, monotonic=clock.monotonic)
    jobs = [job(n, n, shard=n % 2) for n in range(6)]
    for j in jobs:
        q.push(j)
    assert [j.job_id for j in q.pop_ready(100, 10)] == ["j0", "j1"]  # the rest parks
    assert len(q) == 4 and q.find({(2, "j2"), (0, "j0")}) == {(2, "j2"): jobs[2]}
    assert q.discard("j2", 2) is jobs[2] and q.find({(2, "j2")}) == {} and len(q) == 3
    clock.advance(1.0)
    assert [j.job_id for j in q.pop_ready(100, 10)] == ["j4", "j3"]
    assert len(q) == 1 and q.find({(4, "j4"), (5, "j5")}) == {(5, "j5"): jobs[5]}
    assert q.discard_shard(1) == [jobs[5]] and len(q) == 0 and q.drain() == []
