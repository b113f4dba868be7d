"""Re-checks on the poller side, on the embedded store: a row a producer retired (moved or
cancelled) after this poller queued it is dropped from the due queue and marked complete,
once the store confirms it; the store, not the datagram, decides. Driven step by step
with an injected clock, except the last test, which goes through the listener thread."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from scheduler import Client
from scheduler.domain.clock import FakeClock
from scheduler.domain.dispatch import App
from scheduler.domain.keys import from_ms
from scheduler.domain.model import Job
from scheduler.domain.progress import Checkpoint
from scheduler.errors import StoreUnavailable
from scheduler.poller import Poller, PollerConfig
from scheduler.producer.wire import encode
from scheduler.store import SchemaOptions, Store, open_store
from tests.datagrams import send as send_datagrams
from tests.procs import wait_until

T0_MS = 1_800_000_000_000
CONFIG = PollerConfig(checkpoint_interval_s=0, check_clock=False, layout_refresh_s=0)


@pytest.fixture
def store(tmp_path: Any) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path}/store.db")
    s.apply_schema(SchemaOptions(shard_count=4), T0_MS - 60_000)
    yield s
    s.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0_MS)


class Calls(list[str]):
    def __call__(self, job: Any) -> None:
        self.append(job.job_id)


def stepped(store: Store, clock: FakeClock, calls: Calls, shards: Any = range(4), epoch: int = 1) -> Poller:
    poller = Poller(store, App.for_function(calls), clock=clock, config=CONFIG)
    for s in shards:
        poller.claim(s, epoch)
    return poller


def entry(job: Job) -> tuple[int, int, int, str]:
    return (job.shard, job.bucket, job.fire_ms, job.job_id)


def at(ms: int) -> datetime:
    return from_ms(ms)


def queue(poller: Poller, clock: FakeClock, job: Job) -> None:
    """Bring ``job`` within the read horizon and read it into the due queue, not yet due."""
    clock.advance((job.fire_ms - poller.prefetch_ms + 500 - clock.now_ms()) / 1000)
    poller.poll_once()
    assert clock.now_ms() < job.fire_ms and queued(poller) == {job.job_id}


def queued(poller: Poller) -> set[str]:
    with poller.core.cond:
        return {j.job_id for j in poller.core.due._jobs()}


def checkpoint(poller: Poller, store: Store, shard: int) -> Checkpoint:
    poller.reader.maybe_checkpoint(force=True)
    cp = {c.shard: c for c in store.checkpoints()}[shard]
    return Checkpoint(cp.drained, cp.done_cursor)


def dropped_metric(poller: Poller) -> float:
    return poller.metrics.registry.get_sample_value("scheduler_retired_dropped_total") or 0.0


def drive(poller: Poller, clock: FakeClock, seconds: float) -> None:
    end = clock.now_ms() + int(seconds * 1000)
    while clock.now_ms() < end:
        poller.poll_once()
        for job in poller.dispatch_ready():
            poller.fire(job)
        poller.record_outcomes()
        clock.advance(0.1)


def test_a_queued_row_the_store_shows_retired_is_dropped_and_completed(store: Store, clock: FakeClock):
    calls = Calls()
    poller = stepped(store, clock, calls)
    job = Client(store, clock=clock).schedule("gone", at(T0_MS + 10_000), "k")
    queue(poller, clock, job)
    store.cancel(job)  # the producer's change: the row is retired, the poller holds it
    assert poller.nudges.apply([], [entry(job)]) == 0
    assert queued(poller) == set()
    assert poller.stats.retired_dropped == 1 and dropped_metric(poller) == 1
    # Complete: the checkpoint passes the row before its fire time has even come.
    assert checkpoint(poller, store, job.shard).done_cursor == (job.fire_ms, job.job_id)
    drive(poller, clock, 5)
    assert calls == [], "dropped, not fired"
    assert poller.nudges.apply([], [entry(job)]) == 0 and poller.stats.retired_dropped == 1


def test_a_moved_row_fires_once_at_its_new_position(store: Store, clock: FakeClock):
    """Slow-write repair's case: ``move`` retires the old row and writes the new one."""
    calls = Calls()
    poller = stepped(store, clock, calls)
    old = Client(store, clock=clock).schedule("moved", at(T0_MS + 10_000), "k")
    queue(poller, clock, old)
    new = old.evolve(fire_ms=old.fire_ms + 1_500)
    store.move(old, new)
    poller.nudges.apply([], [entry(old)])
    assert queued(poller) == set()
    drive(poller, clock, 5)
    assert calls == ["moved"] and poller.stats.fired == 1


def test_a_queued_row_the_store_shows_pending_is_kept_whatever_the_datagram_says(
        store: Store, clock: FakeClock):
    calls = Calls()
    poller = stepped(store, clock, calls)
    job = Client(store, clock=clock).schedule("kept", at(T0_MS + 10_000), "k")
    queue(poller, clock, job)
    assert poller.nudges.apply([], [entry(job)]) == 0  # forged: nothing was retired
    assert queued(poller) == {"kept"} and poller.stats.retired_dropped == 0
    assert dropped_metric(poller) == 0
    cp = checkpoint(poller, store, job.shard)
    assert cp.done_cursor is None or cp.done_cursor < (job.fire_ms, job.job_id)
    drive(poller, clock, 3)
    assert calls == ["kept"]


def test_a_row_dispatched_already_is_left_to_run(store: Store, clock: FakeClock):
    calls = Calls()
    poller = stepped(store, clock, calls)
    job = Client(store, clock=clock).schedule("running", at(T0_MS + 10_000), "k")
    queue(poller, clock, job)
    clock.advance((job.fire_ms - clock.now_ms()) / 1000)
    held = poller.dispatch_ready()  # handed to a handler, its outcome not recorded yet
    assert [j.job_id for j in held] == ["running"]
    store.cancel(job)
    poller.nudges.apply([], [entry(job)])
    assert poller.stats.retired_dropped == 0
    cp = checkpoint(poller, store, job.shard)
    assert cp.done_cursor is None or cp.done_cursor < (job.fire_ms, job.job_id), \
        "not completed behind the handler's back: the checkpoint waits for its outcome"
    poller.fire(held[0])
    poller.record_outcomes()
    assert calls == ["running"]
    assert checkpoint(poller, store, job.shard).done_cursor == (job.fire_ms, job.job_id)


def test_a_row_taken_early_by_a_nudge_is_dropped_too(store: Store, clock: FakeClock):
    """A due-now row waits in the queue under its due time, not its fire time."""
    calls = Calls()
    poller = stepped(store, clock, calls)
    job = Client(store, clock=clock).schedule("now", at(T0_MS), "k")
    assert job.due_ms < job.fire_ms, "placed by the late-write rule"
    assert poller.nudge([entry(job)]) == 1  # taken ahead of the cursor, queued at its due time
    store.cancel(job)
    poller.nudges.apply([], [entry(job)])
    assert queued(poller) == set() and poller.stats.retired_dropped == 1
    drive(poller, clock, 6)  # the cursor reads the retired row, and skips it
    assert calls == []
    assert checkpoint(poller, store, job.shard).done_cursor == (job.fire_ms, job.job_id)


def test_nothing_is_read_for_entries_that_name_no_row_queued_here(
        store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch):
    client = Client(store, clock=clock)
    job = client.schedule("gone", at(T0_MS + 10_000), "k")
    other = (job.shard + 1) % 4
    reads: list[Any] = []
    real = store.read_buckets

    def read_buckets(parts: Any, limit: int) -> Any:
        reads.append(parts)
        return real(parts, limit)

    monkeypatch.setattr(store, "read_buckets", read_buckets)
    # A poller that does not own the row's shard: skipped without a read.
    elsewhere = stepped(store, clock, Calls(), shards=[s for s in range(4) if s != job.shard])
    assert elsewhere.nudges.apply([], [entry(job)]) == 0 and reads == []
    # The owner, holding the row queued: only an entry that names it where it is is read.
    poller = stepped(store, clock, Calls(), epoch=2)
    queue(poller, clock, job)
    reads.clear()
    store.cancel(job)
    never: list[Any] = [
        (other, job.bucket, job.fire_ms, job.job_id),  # another shard: not where it is queued
        (job.shard, job.bucket + 60, job.fire_ms, job.job_id),  # another bucket
        (job.shard, job.bucket, job.fire_ms + 1, job.job_id),  # another row of the same job
        (job.shard, job.bucket, job.fire_ms, "not-queued"),
        (job.shard, job.bucket, job.fire_ms, "recurring:s:1:2"), "garbage", (1, 2), (True, 0, 0, "a"),
    ]
    assert poller.nudges.apply([], never) == 0
    assert reads == [] and queued(poller) == {"gone"}
    poller.nudges.apply([], [*never, entry(job)])
    assert reads == [[(job.bucket, job.shard, (job.fire_ms, ""), job.fire_ms)]], "one exact range"
    assert queued(poller) == set() and poller.stats.retired_dropped == 1


def test_due_now_and_recheck_entries_share_one_read(
        store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch):
    client = Client(store, clock=clock)
    poller = stepped(store, clock, Calls())
    gone = client.schedule("gone", at(T0_MS + 10_000), "k")
    queue(poller, clock, gone)
    store.cancel(gone)
    now = client.schedule("now", from_ms(clock.now_ms()), "k")
    reads: list[Any] = []
    real = store.read_buckets

    def read_buckets(parts: Any, limit: int) -> Any:
        reads.append(parts)
        return real(parts, limit)

    monkeypatch.setattr(store, "read_buckets", read_buckets)
    assert poller.nudges.apply([entry(now)], [entry(gone)]) == 1
    assert len(reads) == 1 and len(reads[0]) == 2
    assert queued(poller) == {"now"} and poller.stats.retired_dropped == 1


def test_a_store_error_keeps_the_row_queued(store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch):
    poller = stepped(store, clock, Calls())
    job = Client(store, clock=clock).schedule("gone", at(T0_MS + 10_000), "k")
    queue(poller, clock, job)
    store.cancel(job)

    def down(parts: Any, limit: int) -> Any:
        raise StoreUnavailable("down")

    monkeypatch.setattr(store, "read_buckets", down)
    assert poller.nudges.apply([], [entry(job)]) == 0
    assert queued(poller) == {"gone"} and poller.store_fault.failing
    monkeypatch.undo()
    poller.nudges.apply([], [entry(job)])  # the next datagram about it, once the store answers
    assert queued(poller) == set()


# --- through the listener -------------------------------------------------------------------


def test_a_recheck_datagram_drops_the_row_through_the_listener(store: Store, clock: FakeClock):
    """The poller's threads run on a frozen clock: the row waits in the queue, not due,
    until the datagram's re-check drops it."""
    calls = Calls()
    config = PollerConfig(poll_interval_s=0.05, checkpoint_interval_s=0, check_clock=False,
                          notify_address="127.0.0.1:0")
    poller = Poller(store, App.for_function(calls), clock=clock, config=config)
    job = Client(store, clock=clock).schedule("gone", at(T0_MS + 10_000), "k")
    clock.advance((job.fire_ms - poller.prefetch_ms + 500 - clock.now_ms()) / 1000)
    poller.start(range(4))
    try:
        wait_until(lambda: queued(poller) == {"gone"}, 30, "the row read into the due queue")
        store.cancel(job)
        assert poller.nudges.address is not None
        datagrams = encode([], recheck=[entry(job)])
        assert [json.loads(d)["r"] for d in datagrams] == [[list(entry(job))]]
        send_datagrams(poller.nudges.address, *datagrams)
        wait_until(lambda: poller.stats.retired_dropped == 1, 30, "the retired row dropped")
        assert queued(poller) == set() and poller.failure is None
        clock.advance(5)
        wait_until(lambda: checkpoint(poller, store, job.shard).done_cursor == (job.fire_ms, job.job_id),
                   30, "the checkpoint past the dropped row")
        assert calls == [] and poller.nudges.bad == 0
    finally:
        poller.stop()
