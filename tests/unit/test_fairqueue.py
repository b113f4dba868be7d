"""The fair queue of due jobs: due time, priority, turns between keys and kinds, per-key
concurrency, and no head-of-line blocking by a refused kind."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.domain.fairqueue import FairQueue
from scheduler.domain.flow import Limits
from scheduler.domain.gates import Gates
from scheduler.errors import InvalidInput


class J(NamedTuple):
    job_id: str
    kind: str = "k"
    key: str | None = None
    priority: int = 0
    due_ms: int = 0


def always(job: J) -> str | None:
    return None


def ids(jobs: list[J]) -> list[str]:
    return [j.job_id for j in jobs]


def test_never_before_due_and_oldest_first():
    q: FairQueue[J] = FairQueue()
    for i, due in enumerate([300, 100, 200, 500]):
        q.add(J(f"j{i}", due_ms=due))
    assert ids(q.take(10, 250, always)) == ["j1", "j2"]
    assert q.take(10, 299, always) == []
    assert ids(q.take(10, 1000, always)) == ["j0", "j3"]
    assert len(q) == 0


def test_higher_priority_first_but_never_early():
    q: FairQueue[J] = FairQueue()
    q.add(J("low-old", priority=0, due_ms=0))
    q.add(J("high", priority=9, due_ms=50))
    q.add(J("high-later", priority=9, due_ms=500))
    q.add(J("mid", priority=5, due_ms=10))
    assert ids(q.take(10, 100, always)) == ["high", "mid", "low-old"]
    assert ids(q.take(10, 500, always)) == ["high-later"]


def test_keys_take_turns():
    q: FairQueue[J] = FairQueue()
    for i in range(1000):
        q.add(J(f"big{i}", key="big", due_ms=i))
    for i in range(3):
        q.add(J(f"small{i}", key="small", due_ms=5000 + i))
    q.add(J("nokey", due_ms=9000))
    got = ids(q.take(7, 10_000, always))
    assert got == ["big0", "small0", "nokey", "big1", "small1", "big2", "small2"]


def test_per_key_concurrency_parks_and_resumes():
    q: FairQueue[J] = FairQueue()
    q.set_key_limit(Limits("k", per_key_concurrency=2))
    for i in range(5):
        q.add(J(f"a{i}", key="a", due_ms=i))
    q.add(J("b0", key="b", due_ms=10))
    first = q.take(10, 100, always)
    assert ids(first) == ["a0", "b0", "a1"]
    assert q.running("k", "a") == 2
    assert q.take(10, 100, always) == []
    assert q.throttled[("k", "key")] >= 1
    q.finished(first[0])
    assert ids(q.take(10, 100, always)) == ["a2"]
    q.set_key_limit(Limits("k", per_key_concurrency=4))  # raised live
    assert ids(q.take(10, 100, always)) == ["a3", "a4"]
    q.set_key_limit(Limits("k"))
    assert q.running("k", "a") == 4


def test_a_refused_kind_blocks_no_other_kind():
    q: FairQueue[J] = FairQueue()
    for i in range(100):
        q.add(J(f"slow{i}", kind="slow", priority=9, due_ms=i))
    for i in range(3):
        q.add(J(f"fast{i}", kind="fast", priority=0, due_ms=1000 + i))
    asked: Counter[str] = Counter()

    def admit(job: J) -> str | None:
        asked[job.kind] += 1
        return "rate" if job.kind == "slow" else None

    assert ids(q.take(10, 2000, admit)) == ["fast0", "fast1", "fast2"]
    assert asked["slow"] == 1  # asked once per take, not once per job
    assert q.waiting("slow") == 100 and q.throttled[("slow", "rate")] == 1


def test_gates_as_admit_with_pause():
    gates = Gates(lambda: 0.0)
    gates.update(Limits("mail", paused=True))
    q: FairQueue[J] = FairQueue()
    q.add(J("m", kind="mail"))
    q.add(J("s", kind="sms"))
    assert ids(q.take(10, 0, lambda j: gates.try_start(j.kind))) == ["s"]
    assert q.waiting("mail") == 1
    gates.update(Limits("mail"))
    assert ids(q.take(10, 0, lambda j: gates.try_start(j.kind))) == ["m"]


def test_remove_add_twice_and_bad_priority():
    q: FairQueue[J] = FairQueue()
    assert q.add(J("a", due_ms=0)) and not q.add(J("a", due_ms=0))
    q.add(J("b", due_ms=0))
    q.add(J("c", due_ms=100))
    q.take(0, 50, always)  # promotes a and b
    assert q.waiting("k") == 2
    assert q.remove("a") and not q.remove("a") and q.remove("c")
    assert q.waiting("k") == 1
    assert q.add(J("a", due_ms=0))  # queued again after removal: the old entry stays dead
    assert ids(q.take(10, 1000, always)) == ["b", "a"]
    with pytest.raises(InvalidInput):
        q.add(J("x", priority=10))
    assert len(q) == 0


def test_an_admit_that_raises_leaves_the_job_queued():
    q: FairQueue[J] = FairQueue()
    q.add(J("a"))

    def boom(job: J) -> str | None:
        raise RuntimeError("gate broke")

    with pytest.raises(RuntimeError):
        q.take(1, 0, boom)
    assert ids(q.take(1, 0, always)) == ["a"]


def test_a_large_queue_costs_no_scan_per_take():
    """10,000 keys parked at their limit and a refused kind with 10,000 lanes: a take
    asks each refused kind once and never revisits a parked key."""
    q: FairQueue[J] = FairQueue()
    q.set_key_limit(Limits("k", per_key_concurrency=1))
    for i in range(10_000):
        q.add(J(f"a{i}", key=f"key{i}", due_ms=0))
        q.add(J(f"b{i}", key=f"key{i}", due_ms=1))
        q.add(J(f"r{i}", kind="refused", key=f"key{i}", due_ms=0))
    asked = Counter[str]()

    def admit(job: J) -> str | None:
        asked[job.kind] += 1
        return "rate" if job.kind == "refused" else None

    assert len(q.take(20_000, 10, admit)) == 10_000  # one per key
    assert asked == {"k": 10_000, "refused": 1}
    for _ in range(1000):
        assert q.take(10, 10, admit) == []
    assert asked["k"] == 10_000 and asked["refused"] == 1001


# --- properties ---------------------------------------------------------------------------

jobs_strategy = st.lists(
    st.tuples(st.sampled_from(["k", "m"]), st.sampled_from([None, "a", "b", "c"]),
              st.integers(0, 9), st.integers(0, 100)),
    max_size=60)
steps = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 20), st.booleans(), st.booleans()),
                 min_size=1, max_size=30)


@pytest.mark.fuzz
@given(spec=jobs_strategy, plan=steps, limit=st.integers(1, 3))
def test_queue_properties(spec, plan, limit):
    """Never before due; never over the per-key limit; among the jobs a take returns,
    priorities do not rise, and no due job left behind had a higher priority than one
    taken unless its kind was refused or its key at the limit."""
    q: FairQueue[J] = FairQueue()
    q.set_key_limit(Limits("k", per_key_concurrency=limit))
    queued = {f"j{i}": J(f"j{i}", kind, key, prio, due) for i, (kind, key, prio, due) in enumerate(spec)}
    for job in queued.values():
        q.add(job)
    running: list[J] = []
    now = 0
    for n, advance, refuse_m, finish in plan:
        now += advance
        refused: set[str] = set()

        def admit(job: J, refuse_m: bool = refuse_m, refused: set[str] = refused) -> str | None:
            if refuse_m and job.kind == "m":
                refused.add("m")
                return "rate"
            return None

        got = q.take(n, now, admit)
        assert len(got) <= n
        for job in got:
            assert job.due_ms <= now
            assert "m" not in refused or job.kind != "m"
            del queued[job.job_id]
        running.extend(got)
        per_key = Counter((j.kind, j.key) for j in running if j.key is not None and j.kind == "k")
        assert all(c <= limit for c in per_key.values())
        assert [j.priority for j in got] == sorted((j.priority for j in got), reverse=True)
        if got and len(got) == n:
            lowest = min(j.priority for j in got)
            for left in queued.values():
                at_limit = left.kind == "k" and left.key is not None and per_key[("k", left.key)] >= limit
                blocked = left.kind in refused or left.due_ms > now or at_limit
                assert blocked or left.priority <= lowest
        if finish and running:
            q.finished(running.pop(0))
    assert len(q) == len(queued)


@pytest.mark.fuzz
@given(big=st.integers(100, 1000), small=st.integers(1, 10), other_keys=st.integers(0, 5),
       limit=st.none() | st.integers(1, 3))
def test_a_small_key_is_not_starved(big, small, other_keys, limit):
    """With one key's backlog of thousands, each job of a small key starts within
    (number of keys) takes of one job each."""
    q: FairQueue[J] = FairQueue()
    q.set_key_limit(Limits("k", per_key_concurrency=limit))
    for i in range(big):
        q.add(J(f"big{i}", key="big", due_ms=i % 7))
    for k in range(other_keys):
        for i in range(50):
            q.add(J(f"o{k}-{i}", key=f"o{k}", due_ms=3))
    for i in range(small):
        q.add(J(f"small{i}", key="small", due_ms=5))
    taken_small, takes = 0, 0
    while taken_small < small:
        takes += 1
        assert takes <= small * (other_keys + 2), "the small key starved"
        for job in q.take(1, 10, always):
            taken_small += job.key == "small"
            q.finished(job)


def test_kinds_of_one_priority_take_turns():
    q: FairQueue[J] = FairQueue()
    for i in range(100):
        q.add(J(f"bulk{i}", kind="bulk", due_ms=i))
    q.add(J("mail0", kind="mail", due_ms=500))
    q.add(J("mail1", kind="mail", due_ms=501))
    assert ids(q.take(4, 1000, always)) == ["bulk0", "mail0", "bulk1", "mail1"]


@pytest.mark.fuzz
@given(spec=jobs_strategy, sizes=st.lists(st.integers(1, 25), min_size=1, max_size=8),
       removed=st.sets(st.integers(0, 59), max_size=10), tokens=st.integers(0, 80),
       known_due=st.booleans())
def test_one_take_of_n_is_n_takes_of_one(spec, sizes, removed, tokens, known_due):
    """A take of n starts exactly the jobs, in the order, that n takes of one would: the
    run of one lane alone at its priority (taken without a ring's turn per job) changes
    nothing, also with removed jobs, a gate that runs out of tokens mid-run, and jobs
    added as known due."""
    def build() -> FairQueue[J]:
        q: FairQueue[J] = FairQueue()
        batch = [J(f"j{i}", kind, key, prio, due) for i, (kind, key, prio, due) in enumerate(spec)]
        if known_due:
            q.add_due(batch, 100)
        else:
            for job in batch:
                q.add(job)
        for i in removed:
            q.remove(f"j{i}")
        return q

    def gate() -> Callable[[J], str | None]:
        left = [tokens]

        def admit(job: J) -> str | None:
            if job.kind != "m":
                return None
            if left[0] <= 0:
                return "rate"
            left[0] -= 1
            return None
        return admit

    bulk, single = build(), build()
    bulk_admit, single_admit = gate(), gate()
    for n in sizes:
        got = ids(bulk.take(n, 100, bulk_admit))
        one: list[str] = []
        for _ in range(n):
            # Per take, a refused kind sits out: the single takes see the same refusal
            # only while their tokens are gone too, which a shared count guarantees.
            step = single.take(1, 100, single_admit)
            if not step:
                break
            one += ids(step)
        assert got == one
    assert len(bulk) == len(single)


class _PerTurn(FairQueue[J]):
    """The reference: one job per ring turn (no run of a lone keyless lane), and due jobs
    added one by one, then promoted as a take does (no lane joined at once)."""

    def _run(self, *args: object) -> None:
        pass

    def add_due(self, jobs: list[J], now_ms: int) -> None:
        for job in jobs:
            self.add(job)
        self._promote(now_ms)


def _observed(q: FairQueue[J]) -> tuple[object, ...]:
    return (len(q), sorted(ids(q.jobs())), q.waiting_kinds(), sorted(q.parked_kinds()),
            len(q._ready_ids),
            +q.throttled, {k: q.running(*k) for k in [("k", "a"), ("k", "b"), ("m", "a")]})


added = st.lists(st.tuples(st.sampled_from(["k", "k", "k", "m"]),
                           st.sampled_from([None, None, None, "a", "b"]),
                           st.sampled_from([0, 5, 5, 9]), st.integers(-5, 10), st.booleans()),
                 max_size=8)
action = st.one_of(
    st.tuples(st.just("take"), st.integers(0, 10), st.integers(1, 40)),
    st.tuples(st.just("take"), st.integers(0, 10), st.integers(1, 40)),
    st.tuples(st.just("remove"), st.integers(0, 80)),
    st.tuples(st.just("readd"), st.integers(0, 80), st.sampled_from([0, 5, 9]), st.integers(-5, 10)),
    st.tuples(st.just("finish"), st.integers(0, 40)),
    st.tuples(st.just("tokens"), st.sampled_from(["k", "m"]), st.integers(0, 12)),
    st.tuples(st.just("key_limit"), st.sampled_from(["k", "m"]), st.none() | st.integers(1, 2)),
    st.tuples(st.just("excess"), st.sampled_from(["k", "m"]), st.integers(0, 5)),
    st.tuples(st.just("oldest"), st.sampled_from(["k", "m"]), st.integers(0, 5)),
)
ops = st.lists(st.tuples(added, action), min_size=1, max_size=20)


@pytest.mark.fuzz
@given(plan=ops)
def test_a_run_changes_nothing_a_turn_per_job_would_not(plan):
    """The same operations on the queue and on a reference taking one job per ring turn:
    the same jobs in the same order, the same gate calls, and the same bookkeeping
    (waiting counts, refusals, parked keys, running counts), whatever comes between takes."""
    queues: list[FairQueue[J]] = [FairQueue(), _PerTurn()]
    calls: list[list[str]] = [[], []]
    tokens = [{"k": 8, "m": 40}, {"k": 8, "m": 40}]
    taken: list[J] = []
    now, n_added = 0, 0

    def gate(i: int) -> Callable[[J], str | None]:
        def admit(job: J) -> str | None:
            calls[i].append(job.job_id)
            if tokens[i][job.kind] <= 0:
                return "rate"
            tokens[i][job.kind] -= 1
            return None
        return admit

    admits = [gate(0), gate(1)]
    for jobs, op in plan:
        batch = []
        for kind, key, prio, ahead, _known in jobs:
            batch.append(J(f"j{n_added}", kind, key, prio, now + ahead))
            n_added += 1
        if any(known for *_, known in jobs):  # a batch found due (FlowQueue.pop_ready)
            for q in queues:
                q.add_due(batch, now)
        else:
            for job in batch:
                assert {q.add(job) for q in queues} == {True}
        if op[0] == "remove":
            assert len({q.remove(f"j{op[1]}") for q in queues}) == 1
        elif op[0] == "readd":  # a row read again (FlowQueue.push removes, then adds)
            if op[1] < n_added:
                again = J(f"j{op[1]}", "k", None, op[2], now + op[3])
                assert len({q.remove(again.job_id) for q in queues}) == 1
                for q in queues:
                    q.add_due([again], now)
        elif op[0] == "take":
            now += op[1]
            got = [q.take(op[2], now, admits[i]) for i, q in enumerate(queues)]
            assert got[0] == got[1]
            assert calls[0] == calls[1]
            taken += got[0]
        elif op[0] == "finish":
            if taken:
                job = taken.pop(op[1] % len(taken))
                for q in queues:
                    q.finished(job)
        elif op[0] == "tokens":
            for t in tokens:
                t[op[1]] = op[2]
        elif op[0] == "key_limit":
            for q in queues:
                q.set_key_limit(Limits(op[1], per_key_concurrency=op[2]))
        elif op[0] == "excess":
            assert len({tuple(ids(q.take_excess(op[1], op[2]))) for q in queues}) == 1
        else:
            assert len({tuple(ids(q.take_oldest(op[1], op[2]))) for q in queues}) == 1
        assert _observed(queues[0]) == _observed(queues[1])


def test_an_admit_that_raises_mid_run_keeps_the_waiting_count():
    q: FairQueue[J] = FairQueue()
    for i in range(5):
        q.add(J(f"j{i}"))
    calls = [0]

    def third_raises(job: J) -> str | None:
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("gate broke")
        return None

    with pytest.raises(RuntimeError):
        q.take(10, 0, third_raises)
    assert q.waiting("k") == len(q) == 3


def test_jobs_found_due_together_join_the_rings_in_due_order():
    """A batch found due at once joins as the next take's promotion would have it: the
    older job's key first, whatever order the batch came in (the due queue's order is by
    fire time, and a deferred or retried job keeps an older due time)."""
    for batch in ([J("fresh", key="b", due_ms=90), J("deferred", key="a", due_ms=10)],
                  [J("deferred", key="a", due_ms=10), J("fresh", key="b", due_ms=90)]):
        q: FairQueue[J] = FairQueue()
        q.add_due(batch, 100)
        assert ids(q.take(1, 100, always)) == ["deferred"]


def test_an_int_enum_priority_is_its_value():
    from enum import IntEnum

    from scheduler.domain.flow import check_priority

    class Priority(IntEnum):
        HIGH = 9

    assert check_priority(Priority.HIGH) == 9 and type(check_priority(Priority.HIGH)) is int
    for bad in (True, 10, -1, 1.0, "5", None):
        with pytest.raises(InvalidInput):
            check_priority(bad)
