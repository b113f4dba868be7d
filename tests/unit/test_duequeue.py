from __future__ import annotations

from scheduler.domain.clock import FakeClock
from scheduler.domain.model import Job
from scheduler.domain.ratelimit import TokenBucket
from scheduler.poller.duequeue import DueQueue


def job(job_id: str, fire_ms: int, shard: int = 0) -> Job:
    return Job(job_id=job_id, kind="k", data=b"", data_json=False, due_ms=fire_ms, fire_ms=fire_ms,
               bucket=0, shard=shard)


def test_token_bucket_on_monotonic_time():
    clock = FakeClock()
    tb = TokenBucket(10, burst=2, monotonic=clock.monotonic)
    assert tb.try_take() and tb.try_take() and not tb.try_take()
    assert abs(tb.wait_s() - 0.1) < 1e-9
    clock.step_wall(3_600_000)  # a wall-clock step mints nothing
    assert not tb.try_take()
    clock.advance(0.1)
    assert tb.try_take()
    assert TokenBucket(None).try_take(1e9)


def test_a_token_bucket_given_the_callers_clock_reading_never_mints_from_a_stale_one():
    clock = FakeClock()
    tb = TokenBucket(10, burst=1, monotonic=clock.monotonic)
    t0 = clock.monotonic()
    assert tb.try_take(1.0, t0) and not tb.try_take(1.0, t0)
    clock.advance(0.1)
    t1 = clock.monotonic()
    assert tb.try_take(1.0, t1)
    assert not tb.try_take(1.0, t0)  # older than the last refill: adds nothing
    assert not tb.try_take(1.0, t1 + 0.05)  # half a token
    assert tb.try_take(1.0, t1 + 0.1)


def test_nothing_leaves_before_its_fire_time_and_oldest_first():
    q = DueQueue()
    for i, t in enumerate([300, 100, 200]):
        q.push(job(f"j{i}", t))
    assert q.pop_ready(99, 10) == []
    assert [j.job_id for j in q.pop_ready(250, 10)] == ["j1", "j2"]
    assert q.next_wake_s(250) == 0.05
    assert [j.job_id for j in q.pop_ready(300, 10)] == ["j0"]
    assert len(q) == 0


def test_poller_rate_bounds_a_burst_of_overdue_jobs():
    clock = FakeClock()
    q = DueQueue(poller_rate=100, monotonic=clock.monotonic)
    for i in range(1000):
        q.push(job(f"j{i}", i))
    dispatched = []
    for _ in range(10):  # one second
        dispatched += q.pop_ready(10_000, 1000)
        clock.advance(0.1)
    assert 95 <= len(dispatched) <= 115
    assert [j.job_id for j in dispatched] == [f"j{i}" for i in range(len(dispatched))]


def test_a_throttled_shard_does_not_hold_back_the_others():
    clock = FakeClock()
    q = DueQueue(shard_rate=1, monotonic=clock.monotonic)
    for i in range(5):
        q.push(job(f"busy{i}", i, shard=0))
    q.push(job("other", 10, shard=1))
    first = [j.job_id for j in q.pop_ready(100, 10)]
    assert first == ["busy0", "other"]
    clock.advance(1.0)
    assert [j.job_id for j in q.pop_ready(100, 10)] == ["busy1"]


def test_discard_shard():
    q = DueQueue()
    q.push(job("a", 1, 0))
    q.push(job("b", 2, 1))
    assert [j.job_id for j in q.discard_shard(0)] == ["a"]
    assert [j.job_id for j in q.drain()] == ["b"]


def test_a_job_pushed_with_an_earlier_time_leaves_then():
    """A due-now job taken ahead of the cursor leaves at its due time, not its fire time."""
    q = DueQueue()
    j = Job(job_id="now", kind="k", data=b"", data_json=False, due_ms=1_000, fire_ms=4_000,
            bucket=0, shard=0)
    q.push(j, at_ms=j.due_ms)
    assert q.pop_ready(999, 10) == []
    assert q.pop_ready(1_000, 10) == [j]
