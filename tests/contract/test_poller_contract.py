"""The poller against both stores, driven step by step with an injected clock."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from scheduler import Client, JobSpec, Status
from scheduler.domain.clock import FakeClock, SystemClock
from scheduler.domain.dispatch import App
from scheduler.domain.keys import from_ms
from scheduler.poller import Poller, PollerConfig
from scheduler.store import SchemaOptions, Store
from tests.conftest import make_store

T0_MS = 1_800_000_000_000
T0 = from_ms(T0_MS)
FAST = PollerConfig(checkpoint_interval_s=0, check_clock=False, layout_refresh_s=0, read_limit=50)


@pytest.fixture
def pstore(store_kind: str, request: Any, tmp_path: Any):
    st = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=4), now_ms=T0_MS - 60_000)
    yield st
    st.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0_MS)


class Recorder:
    def __init__(self, clock: FakeClock, fail: set[str] | None = None) -> None:
        self.clock, self.fail = clock, fail or set()
        self.calls: list[tuple[str, int, int]] = []

    def __call__(self, job) -> None:
        self.calls.append((job.job_id, self.clock.now_ms(), job.attempt))
        if job.job_id in self.fail:
            raise RuntimeError("nope")


def drive(poller: Poller, clock: FakeClock, seconds: float, step_ms: int = 100) -> None:
    end = clock.now_ms() + int(seconds * 1000)
    while clock.now_ms() < end:
        poller.poll_once()
        for job in poller.dispatch_ready():
            assert job.fire_ms <= clock.now_ms(), "dispatched before its fire time"
            assert job.due_ms <= clock.now_ms(), "dispatched before its due time"
            poller.fire(job)
        poller.record_outcomes()
        clock.advance(step_ms / 1000)


def make_poller(store: Store, clock: FakeClock, handler, config: PollerConfig = FAST,
                shards=range(4), epoch: int = 1, app: App | None = None) -> Poller:
    poller = Poller(store, app or App.for_function(handler), clock=clock, config=config)
    for s in shards:
        poller.claim(s, epoch)
    return poller


def test_fires_everything_on_time_never_early(pstore, clock):
    client = Client(pstore, clock=clock)
    specs = [JobSpec(f"j{i}", T0 + timedelta(seconds=5, milliseconds=i * 37), "k", {"i": i})
             for i in range(300)]
    client.schedule_many(specs)
    rec = Recorder(clock)
    poller = make_poller(pstore, clock, rec)
    drive(poller, clock, 20)
    fired = Counter(c[0] for c in rec.calls)
    assert set(fired) == {s.job_id for s in specs} and max(fired.values()) == 1
    for job_id, at, _ in rec.calls:
        due = client.get(job_id).due_ms
        assert due <= at <= due + 100  # one step of the fake clock
    assert client.get("j7").status is Status.FIRED and client.get("j7").attempts == 1


def test_jobs_written_while_the_bucket_is_open_and_late_writes(pstore, clock):
    client = Client(pstore, clock=clock)
    rec = Recorder(clock)
    poller = make_poller(pstore, clock, rec)
    drive(poller, clock, 3)  # the current bucket is open and being read
    client.schedule("open", from_ms(clock.now_ms() + 4000), "k")
    client.schedule("late", T0 - timedelta(hours=1), "k")  # due long ago
    drive(poller, clock, 10)
    assert {c[0] for c in rec.calls} == {"open", "late"}
    late = next(c for c in rec.calls if c[0] == "late")
    assert late[1] - client.get("late").fire_ms < 200


def test_catch_up_after_downtime_is_oldest_first_and_rate_bounded(pstore, clock):
    client = Client(pstore, clock=clock)
    client.schedule_many([JobSpec(f"c{i}", T0 + timedelta(seconds=10 + i * 6), "k") for i in range(50)])
    clock.advance(600)  # ten minutes of downtime: 50 jobs over 5 buckets are overdue
    rec = Recorder(clock)
    poller = make_poller(pstore, clock, rec, PollerConfig(checkpoint_interval_s=0, check_clock=False,
                                                          layout_refresh_s=0, max_rate=10))
    drive(poller, clock, 2)
    assert 10 <= len(rec.calls) <= 25, "a 10 jobs/s bound dispatches about 20 in 2 s"
    drive(poller, clock, 10)
    order = [c[0] for c in rec.calls]
    assert order == [f"c{i}" for i in range(50)], "catch-up fires oldest first"


def test_checkpoint_advances_and_a_new_owner_does_not_refire(pstore, clock):
    client = Client(pstore, clock=clock)
    client.schedule_many([JobSpec(f"r{i}", T0 + timedelta(seconds=5 + i), "k") for i in range(120)])
    first = Recorder(clock)
    p1 = make_poller(pstore, clock, first, epoch=1)
    drive(p1, clock, 70)  # fires r0..r64 or so, across a bucket boundary
    fired_first = {c[0] for c in first.calls}
    assert len(fired_first) >= 60
    cps = {c.shard: c for c in pstore.checkpoints()}
    assert all(c.drained >= T0_MS // 1000 - 60 for c in cps.values())
    # p1 "crashes" (no stop); p2 takes over with a newer epoch.
    second = Recorder(clock)
    p2 = make_poller(pstore, clock, second, epoch=2)
    drive(p2, clock, 70)
    fired_second = {c[0] for c in second.calls}
    assert fired_first | fired_second == {f"r{i}" for i in range(120)}
    assert not fired_first & fired_second, "the new owner resumed after the saved cursor"
    # The stale owner is fenced: its next checkpoint write is refused and it drops the shards.
    drive(p1, clock, 1)
    assert p1.shards == set() and sorted(p1.stats.lost_shards) == [0, 1, 2, 3]


def test_retries_then_dead_letter_and_unknown_kind(pstore, clock):
    client = Client(pstore, clock=clock)
    app = App()
    calls: list[int] = []

    @app.handler("flaky", max_attempts=3, backoff_base_s=1)
    def flaky(job):
        calls.append(job.attempt)
        raise ValueError("still broken")

    client.schedule("f1", T0 + timedelta(seconds=5), "flaky")
    client.schedule("u1", T0 + timedelta(seconds=5), "unknown")
    poller = make_poller(pstore, clock, None, app=app)
    drive(poller, clock, 40)
    assert calls == [1, 2, 3]
    f1 = client.get("f1")
    assert f1.status is Status.DEAD and f1.attempts == 3 and "still broken" in (f1.last_error or "")
    u1 = client.get("u1")
    assert u1.status is Status.DEAD and u1.last_error == "no handler for kind 'unknown'"
    assert sorted(d.job_id for d in pstore.dead_letters()) == ["f1", "u1"]


def test_cancelled_jobs_do_not_fire(pstore, clock):
    client = Client(pstore, clock=clock)
    client.schedule("keep", T0 + timedelta(seconds=30), "k")
    client.schedule("drop", T0 + timedelta(seconds=30), "k")
    assert client.cancel("drop")
    rec = Recorder(clock)
    drive(make_poller(pstore, clock, rec), clock, 40)
    assert [c[0] for c in rec.calls] == ["keep"]


def test_refuses_to_fire_beyond_the_skew_bound(pstore):
    skewed = SystemClock(offset_ms=5_000)
    poller = Poller(pstore, App.for_function(lambda job: None), clock=skewed,
                    config=PollerConfig(check_clock=True))
    poller.poll_once()
    assert poller.refusing is not None and "skew" in poller.refusing
    assert poller.dispatch_ready() == []
    honest = Poller(pstore, App.for_function(lambda job: None), config=PollerConfig(check_clock=True))
    honest.poll_once()
    assert honest.refusing is None


def test_shrinking_and_growing_shards_fire_everything(pstore, clock):
    client = Client(pstore, clock=clock)
    # Written with S=4, far ahead (after both cutovers below).
    client.schedule_many([JobSpec(f"early{i}", T0 + timedelta(minutes=5, seconds=i), "k") for i in range(40)])
    client.resize(2, T0 + timedelta(minutes=2))
    client.resize(8, T0 + timedelta(minutes=4))
    client.schedule_many([JobSpec(f"late{i}", T0 + timedelta(minutes=5, seconds=i), "k") for i in range(40)])
    rec = Recorder(clock)
    poller = make_poller(pstore, clock, rec, shards=range(8))
    drive(poller, clock, 400, step_ms=500)
    assert Counter(c[0] for c in rec.calls) == Counter(
        [f"early{i}" for i in range(40)] + [f"late{i}" for i in range(40)])


def test_a_slow_write_is_moved_ahead_of_the_cursors(pstore, clock, monkeypatch):
    client = Client(pstore, clock=clock)
    real_insert = pstore.insert_many

    def slow_insert(jobs, progress=None):
        real_insert(jobs, progress)
        clock.advance(3)  # the acknowledgement arrives 3 s later (GC pause, overload)

    monkeypatch.setattr(pstore, "insert_many", slow_insert)
    job = client.schedule("slow", T0 + timedelta(seconds=1), "k")
    assert job.fire_ms >= clock.now_ms() + client.meta.late_margin_ms - client.meta.max_skew_ms
    far = client.schedule("far", T0 + timedelta(minutes=10), "k")
    assert far.fire_ms == far.due_ms, "a job far ahead is not at risk and stays put"


def test_an_idempotent_retry_of_an_unsafe_write_moves_it(pstore, clock):
    client = Client(pstore, clock=clock)
    first = client.schedule("retry-me", T0 + timedelta(seconds=10), "k")
    clock.advance(9)  # the caller retries much later, the job now within a cursor's reach
    again = client.schedule("retry-me", T0 + timedelta(seconds=10), "k")
    assert again.fire_ms > first.fire_ms and again.due_ms == first.due_ms


def test_rereading_the_open_bucket_costs_only_new_rows(pstore, clock):
    client = Client(pstore, clock=clock)
    client.schedule_many([JobSpec(f"o{i}", T0 + timedelta(seconds=5, milliseconds=i), "k")
                          for i in range(500)])
    rec = Recorder(clock)
    poller = make_poller(pstore, clock, rec)
    drive(poller, clock, 10)
    assert len(rec.calls) == 500
    reads, rows = poller.stats.reads, poller.stats.rows_read
    drive(poller, clock, 20)  # the bucket is still open: it is re-read, from the cursor
    assert poller.stats.reads > reads
    assert poller.stats.rows_read == rows, "fired rows are never read again"
