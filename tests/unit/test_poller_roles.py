"""Each of the poller's thread roles alone, with a fake store and the real queues:
the chunk hand-back, the timeout watchdog, the recorder's linger and its failures, the
shutdown order, and a crash of each role failing the poller."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from scheduler.domain.clock import SystemClock
from scheduler.domain.dispatch import App, Outcome
from scheduler.domain.flow import Limits
from scheduler.domain.keys import bucket_of_ms
from scheduler.domain.layout import Layout, Layouts
from scheduler.domain.model import Job
from scheduler.domain.progress import Checkpoint, ShardProgress
from scheduler.errors import StoreUnavailable
from scheduler.observe.metrics import PollerMetrics
from scheduler.poller import Poller, PollerConfig, ShardState
from scheduler.poller.recorder import LINGER_BELOW, Recorder
from scheduler.poller.shared import Core, Gates, OwnedShard
from scheduler.poller.workers import ThreadWorkers, _Worker
from scheduler.store.base import ShardCheckpoint, StoreMeta

META = StoreMeta(schema_version=1, bucket_width_s=60, late_margin_ms=3000, max_skew_ms=500,
                 origin_bucket=0)


class FakeStore:
    """What the poller's roles call, in memory, with a log of the writes in order."""

    url = "fake://"

    def __init__(self, rows: list[Job] | None = None) -> None:
        self.rows = rows or []
        self.calls: list[str] = []
        self.fail: dict[str, BaseException] = {}

    def _call(self, name: str) -> None:
        if name in self.fail:
            raise self.fail[name]
        self.calls.append(name)

    def meta(self) -> StoreMeta:
        return META

    def layouts(self) -> Layouts:
        return Layouts([Layout(0, 1)])

    def server_now_ms(self) -> int:
        return SystemClock().now_ms()

    def checkpoints(self) -> list[ShardCheckpoint]:
        return []

    def set_notify_endpoint(self, owner: str, address: str | None, now_ms: int) -> None:
        pass  # (not in ``calls``: the roles' order is what these tests check)

    def notify_endpoints(self, now_ms: int) -> dict[str, str]:
        return {}

    def flow_limits(self) -> list[Any]:
        return []  # (flow control: no limits; not in ``calls``)

    def claim_shard(self, shard: int, owner: str, epoch: int, initial: int, now_ms: int) -> Checkpoint:
        self._call("claim_shard")
        return Checkpoint(SystemClock().now_ms() // 1000 // 60 * 60 - 120)

    def read_bucket(self, bucket: int, shard: int, after: Any, until_ms: int, limit: int) -> list[Job]:
        self._call("read_bucket")
        return self._rows(bucket, after, until_ms, limit)

    def read_buckets(self, parts: Any, limit: int) -> list[list[Job]]:
        # (the recorder's read-back of rows it is about to place or dead-letter; not in
        # ``calls``, which are the reader's reads and the writes)
        return [self._rows(b, after, until, limit) for b, _s, after, until in parts]

    def _rows(self, bucket: int, after: Any, until_ms: int, limit: int) -> list[Job]:
        key = after or (0, "")
        return sorted(j for j in self.rows if j.bucket == bucket and (j.fire_ms, j.job_id) > key
                      and j.fire_ms <= until_ms)[:limit]

    def save_checkpoint(self, shard: int, epoch: int, cp: Checkpoint, now_ms: int) -> None:
        self._call("save_checkpoint")

    def release_shard(self, shard: int, epoch: int, now_ms: int) -> bool:
        self._call("release_shard")
        return True

    def record_fired(self, jobs: list[Job], now_ms: int) -> None:
        self._call("record_fired")

    def record_retry(self, old: Job, new: Job, error: str, now_ms: int) -> None:
        self._call("record_retry")

    def record_dead(self, job: Job, error: str, now_ms: int) -> None:
        self._call("record_dead")


def job(i: int, kind: str = "k", fire_ms: int | None = None) -> Job:
    fire = SystemClock().now_ms() - 1000 if fire_ms is None else fire_ms
    return Job(f"j{i:04d}", kind, b"{}", True, fire, fire, fire // 1000 // 60 * 60, 0)


def core(config: PollerConfig | None = None, store: FakeStore | None = None, *,
         on_failure: Callable[[str], None] = lambda role: None,
         gates: Callable[[Core], Gates] | None = None) -> Core:
    return Core(store or FakeStore(), SystemClock(), config or PollerConfig(), "test",  # type: ignore[arg-type]
                PollerMetrics(), META, gates=gates, on_failure=on_failure)


def wait_until(cond: Callable[[], bool], seconds: float = 5.0) -> None:
    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.01)


def drain(c: Core) -> list[Outcome]:
    out: list[Outcome] = []
    while not c.outcomes.empty():
        out.extend(c.outcomes.get_nowait())
    return out


# --- workers ----------------------------------------------------------------------------


def test_a_slow_chunk_hands_its_unstarted_jobs_back():
    """Back to the poller's queue (where they wait their turn by priority again), not to
    the end of the work queue behind chunks dispatched after them."""
    c = core()
    c.shards[0] = OwnedShard(ShardProgress(0, 60, Checkpoint(0)), 1, Checkpoint(0), running=4)
    workers = ThreadWorkers(c, App.for_function(lambda j: time.sleep(0.02)))
    jobs = [job(i) for i in range(4)]
    w = _Worker(c.flight.new_slot())
    c.flight.dispatched += 4
    done = workers.fire_chunk(jobs, w)
    assert [o.job for o in done] == jobs[:1]
    assert workers.work.empty() and not workers.fast
    assert sorted(c.due._jobs()) == jobs[1:], "back in the poller's queue"
    assert c.flight.in_flight() == 0 and c.shards[0].running == 1
    assert [o.job for o in drain(c)] == jobs[:1]


def test_a_hung_handler_times_out_its_worker_is_replaced_and_its_late_result_discarded():
    release = threading.Event()
    app = App()

    @app.handler("hang", timeout_s=0.05, max_attempts=3)
    def hang(j: Job) -> None:
        release.wait(10)

    @app.handler("ok")
    def ok(j: Job) -> None:
        pass

    c = core(PollerConfig(concurrency=2))
    workers = ThreadWorkers(c, app)
    workers.start()
    try:
        c.flight.dispatched += 4
        workers.submit([job(0, "hang")])
        workers.submit([job(1, "hang"), job(2, "ok")])  # j2 waits behind a hung handler
        workers.submit([job(3, "ok")])
        wait_until(lambda: c.flight.in_flight() == 0)
        outcomes = {o.job.job_id: o for o in drain(c)}
        assert outcomes["j0000"].error == "timed out after 0.05 s" and outcomes["j0000"].retry_at_ms
        assert outcomes["j0001"].error == "timed out after 0.05 s"
        assert outcomes["j0002"].ok and outcomes["j0003"].ok
        assert workers.abandoned_alive == 2 and len(workers.live) == 2
        assert c.stats.timed_out == 2 and c.failure is None
        release.set()
        wait_until(lambda: workers.abandoned_alive == 0)
        assert c.outcomes.empty(), "a late result of an abandoned handler is discarded"
    finally:
        release.set()
        c.stopping.set()
        workers.stop()
        c.stopped.set()


def test_a_timed_out_handler_keeps_its_kinds_slot_until_it_returns():
    """A concurrency limit counts handlers running: the abandoned call still runs, so its
    slot is freed when it returns, not when its timeout is recorded."""
    release = threading.Event()
    app = App()

    @app.handler("c", timeout_s=0.05, max_attempts=3)
    def hang(j: Job) -> None:
        release.wait(10)

    c = core(PollerConfig(concurrency=2))
    c.due.set_limits(Limits("c", concurrency=1), None, 1)
    workers = ThreadWorkers(c, app)
    workers.start()
    try:
        first, second = job(0, "c"), job(1, "c")
        c.due.push(first)
        c.due.push(second)
        with c.cond:
            [taken] = c.due.pop_ready(SystemClock().now_ms(), 10)
        assert taken == first
        c.flight.dispatched += 1
        workers.submit([taken])
        wait_until(lambda: workers.abandoned_alive == 1)
        [timed_out] = drain(c)
        assert timed_out.error == "timed out after 0.05 s"
        with c.cond:
            c.due.finished(timed_out.job)  # as the recorder does once it is written
            assert c.due.pop_ready(SystemClock().now_ms(), 10) == [], "its handler still runs"
        release.set()
        wait_until(lambda: workers.abandoned_alive == 0)
        with c.cond:
            assert c.due.pop_ready(SystemClock().now_ms(), 10) == [second], "it returned: the slot is free"
    finally:
        release.set()
        c.stopping.set()
        workers.stop()
        c.stopped.set()


def test_more_hung_threads_than_the_cap_fail_the_poller():
    release = threading.Event()
    app = App.for_function(lambda j: release.wait(10), timeout_s=0.02)
    failed: list[str] = []
    c = core(PollerConfig(concurrency=2, max_abandoned_threads=1), on_failure=failed.append)
    workers = ThreadWorkers(c, app)
    workers.start()
    try:
        c.flight.dispatched += 2
        workers.submit([job(0)])
        workers.submit([job(1)])
        wait_until(lambda: bool(failed))
        assert "2 handler threads hung past their timeouts (the cap is 1)" in (c.failure or "")
        assert failed == ["worker"]
    finally:
        release.set()
        c.stopped.set()


# --- recorder ---------------------------------------------------------------------------


class CountingEvent(threading.Event):
    """``core.stopped`` counting its ``wait`` calls: each is one turn of linger's loop."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def test_the_recorder_lingers_only_while_jobs_are_running(monkeypatch):
    """Causes, not durations: linger's clock is frozen, so it can only return because
    nothing is running, because the running job finished, because enough outcomes are
    waiting, or because its clock passed the deadline; and while a job runs it goes on
    waiting (it has turned its loop and not returned)."""
    import scheduler.poller.recorder as recorder_module

    mono = [1000.0]
    monkeypatch.setattr(recorder_module, "time", type("FrozenTime", (), {"monotonic": lambda: mono[0]}))
    c = core()
    stopped = c.stopped = CountingEvent()
    rec = Recorder(c)
    first = threading.Thread(target=rec.linger, args=(1.0,), daemon=True)
    first.start()
    wait_until(lambda: not first.is_alive())
    assert stopped.waits == 0, "nothing running: nothing to wait for"

    def linger_until(cause: Callable[[], None]) -> None:
        c.flight.dispatched += 1  # one job running
        t = threading.Thread(target=rec.linger, args=(1.0,), daemon=True)
        turns = stopped.waits
        t.start()
        wait_until(lambda: stopped.waits >= turns + 3)
        assert t.is_alive(), "a job is running: it waits for more outcomes"
        cause()
        wait_until(lambda: not t.is_alive())

    def finish() -> None:
        c.flight.finished[0] += 1

    def pass_deadline() -> None:
        mono[0] += 1.0

    def enough_waiting() -> None:
        for i in range(LINGER_BELOW):
            c.outcomes.put([Outcome(job(i), True)])

    linger_until(finish)
    linger_until(pass_deadline)
    linger_until(enough_waiting)


def test_the_recorder_keeps_outcomes_when_the_store_fails():
    store = FakeStore()
    c = core(store=store)
    rec = Recorder(c)
    c.outcomes.put([Outcome(job(1), True), Outcome(job(2), False, "x", None, True)])
    store.fail["record_fired"] = StoreUnavailable("down")
    assert rec.record_outcomes() == -1 and c.store_fault.failing
    del store.fail["record_fired"]
    assert rec.record_outcomes() == 2 and not c.store_fault.failing
    assert store.calls == ["record_fired", "record_dead"] and c.stats.fired == 1 and c.stats.dead == 1


# --- the poller: shutdown order and crashes ---------------------------------------------


def test_shutdown_finishes_in_flight_then_records_then_checkpoints_then_releases():
    started = threading.Event()
    store = FakeStore([job(1)])

    def slow(j: Job) -> None:
        started.set()
        time.sleep(0.3)

    poller = Poller(store, App.for_function(slow), config=PollerConfig(check_clock=False))  # type: ignore[arg-type]
    poller.start([0], epoch=1)
    assert started.wait(5)
    poller.stop()
    writes = [c for c in store.calls if c not in ("read_bucket", "claim_shard")]
    # (The reader may save checkpoints before: the cursor moves over empty buckets.)
    assert writes[-3:] == ["record_fired", "save_checkpoint", "release_shard"]
    assert poller.stats.fired == 1 and poller.failure is None


class Boom(BaseException):
    """Escapes every ``except Exception``, like a bug would."""


def _crash_reader(p: Poller, store: FakeStore) -> None:
    store.fail["read_bucket"] = RuntimeError("boom")


def _crash_dispatch(p: Poller, store: FakeStore) -> None:
    def due_jobs() -> list[Job]:
        raise RuntimeError("boom")
    p.dispatcher.due_jobs = due_jobs  # type: ignore[method-assign]


def _crash_recorder(p: Poller, store: FakeStore) -> None:
    store.fail["record_fired"] = RuntimeError("boom")


def _raise_boom(j: Job) -> None:
    raise Boom("boom")


async def _async_boom(j: Job) -> None:
    raise Boom("boom")


def _crash_watchdog(p: Poller, store: FakeStore) -> None:
    def abandon(w: Any) -> None:
        raise RuntimeError("boom")
    p.workers._abandon = abandon  # type: ignore[union-attr, method-assign]


@pytest.mark.parametrize("role,inject", [("reader", _crash_reader), ("dispatch", _crash_dispatch),
                                         ("recorder", _crash_recorder),
                                         ("watchdog", _crash_watchdog),  # on a timeout
                                         ("worker", None),  # its handler raises Boom
                                         ("event-loop", None)])  # its coroutine raises Boom
def test_a_crash_in_any_thread_fails_the_poller_and_it_stops(role, inject, caplog):
    store = FakeStore([job(1)])
    handler = {"worker": _raise_boom, "event-loop": _async_boom,
               "watchdog": lambda j: time.sleep(0.5)}.get(role, lambda j: None)
    poller = Poller(store, App.for_function(handler, timeout_s=0.02),  # type: ignore[arg-type]
                    config=PollerConfig(check_clock=False, shutdown_timeout_s=1))
    if inject is not None:
        inject(poller, store)
    with caplog.at_level(logging.ERROR, logger="scheduler.poller"):
        poller.start([0], epoch=1)
        assert poller.failed.wait(5)
        wait_until(lambda: "release_shard" in store.calls)
    assert poller.failure is not None and f"the {role} thread crashed" in poller.failure
    crashed = [r for r in caplog.records if getattr(r, "action", None) == "thread_crashed"]
    assert len(crashed) == 1 and "Traceback" in crashed[0].getMessage()
    assert poller.state(0) is ShardState.RELEASED and poller.shards == set()
    if role == "reader":
        assert "save_checkpoint" not in store.calls, "the reader's state is not trusted"


# --- the core's collaborators -------------------------------------------------------------


class _SkipAll:
    """Gates that skip every job, built from the core they serve."""

    def __init__(self, c: Core) -> None:
        self.core = c
        self.pregated: list[list[Job]] = []

    def gate(self, jobs: list[Job]) -> dict[str, Outcome]:
        now = self.core.clock.now_ms()
        return {j.job_id: Outcome(j, False, "skipped: test", None, False, now, skip="test") for j in jobs}

    def pregate(self, jobs: list[Job]) -> None:
        self.pregated.append(jobs)

    def close(self) -> None:
        pass


def test_the_core_builds_its_gates_from_itself_and_the_workers_use_them():
    c = core(gates=_SkipAll)
    assert isinstance(c.gates, _SkipAll) and c.gates.core is c
    workers = ThreadWorkers(c, App.for_function(lambda j: pytest.fail("a skipped job ran")))
    done = workers.fire_chunk([job(0), job(1)], _Worker(c.flight.new_slot()))
    assert [o.error for o in done] == ["skipped: test"] * 2
    assert core().gate is None and core().pregate is None, "no gates: every job fires"


def test_a_poller_gives_the_core_and_the_loop_their_collaborators_when_it_builds_them():
    async def handler(j: Job) -> None:
        pass

    p = Poller(FakeStore(), App.for_function(handler), config=PollerConfig(notify_address=None))  # type: ignore[arg-type]
    try:
        assert p.core.gate == p.occurrences.gate and p.core.pregate == p.occurrences.pregate
        assert p.core.on_failure == p._on_failure
        take = getattr(p.workers, "take", None)
        assert take is not None and take() == [], "the loop takes due jobs from the core itself"
    finally:
        p.stop(0)


_COLLABORATORS = {"gate", "pregate", "on_failure", "take", "gates"}


def test_no_collaborator_of_the_core_or_the_workers_is_assigned_from_outside():
    """``Core`` and the workers get them in their constructors: an assignment
    ``x.gate = ...`` (x not ``self``) anywhere in the package, or ``x.core.lease = ...``,
    would be one made after construction."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "scheduler"
    found = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                continue
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if not isinstance(target, ast.Attribute):
                    continue
                owner = ast.unparse(target.value)
                if (target.attr in _COLLABORATORS and owner != "self") or (
                        target.attr == "lease" and owner.split(".")[-1] == "core"):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(target)}")
    assert found == []


def test_the_nudge_listener_is_bound_before_any_thread_can_stop_the_poller():
    """A thread that crashes at once stops the poller, and the stop closes the listener: a
    listener bound after the threads started could be bound after that close, and leak."""
    store = FakeStore([])
    poller = Poller(store, App.for_function(lambda j: None),  # type: ignore[arg-type]
                    config=PollerConfig(check_clock=False, shutdown_timeout_s=1,
                                        notify_address="127.0.0.1:0"))
    bound_at_start: list[bool] = []
    start_thread = poller.core.start_thread

    def recording(*args: Any) -> Any:
        bound_at_start.append(poller.nudges.sock is not None)
        return start_thread(*args)

    poller.core.start_thread = recording  # type: ignore[method-assign, assignment]
    poller.start([0], epoch=1)
    poller.stop()
    assert bound_at_start and all(bound_at_start), bound_at_start
    assert poller.nudges.sock is not None and poller.nudges.sock.fileno() == -1, "left open"


def test_a_job_of_a_kind_paused_after_it_was_handed_to_a_worker_is_held_not_run():
    from scheduler.domain.flow import Limits
    from scheduler.poller.flowqueue import HELD, HOLD_S

    c = core()
    c.due.set_limits(Limits("p", paused=True), None, None)
    ran: list[str] = []
    workers = ThreadWorkers(c, App.for_function(lambda j: ran.append(j.job_id)))
    before = SystemClock().now_ms()
    done = workers.fire_chunk([job(0, kind="p"), job(1)], _Worker(c.flight.new_slot()))
    assert ran == ["j0001"], "the other kind runs, the paused one does not"
    held = done[0]
    assert (held.job.job_id, held.error, held.skip) == ("j0000", HELD, "wait")
    assert held.retry_at_ms is not None and held.retry_at_ms >= before + HOLD_S * 1000
    c.due.set_limits(Limits("p"), None, None)
    assert c.due.paused == frozenset()


def test_a_slow_chunk_takes_back_the_chunks_still_waiting_and_keeps_the_stop_markers():
    """Left in the work queue, each waiting chunk would start its first job ahead of
    higher priorities; the stop's end markers must stay for the workers."""
    c = core()
    c.shards[0] = OwnedShard(ShardProgress(0, 60, Checkpoint(0)), 1, Checkpoint(0), running=6)
    workers = ThreadWorkers(c, App.for_function(lambda j: time.sleep(0.02)))
    jobs = [job(i) for i in range(6)]
    c.flight.dispatched += 6
    workers.work.put(jobs[3:5])
    workers.work.put(None)
    workers.work.put(jobs[5:])
    done = workers.fire_chunk(jobs[:3], _Worker(c.flight.new_slot()))
    assert [o.job for o in done] == jobs[:1]
    assert sorted(c.due._jobs()) == jobs[1:], "every unstarted job is back in the poller's queue"
    assert workers.work.get_nowait() is None and workers.work.empty()
    assert c.flight.in_flight() == 0


def test_jobs_handed_back_for_a_shard_being_released_are_dropped_not_queued():
    """Queued again, they would fire after the release saved its checkpoint before them:
    on a poller that no longer owns the shard, and again on its next owner."""
    from scheduler.poller.shared import ShardState

    c = core()
    st = OwnedShard(ShardProgress(0, 60, Checkpoint(0)), 1, Checkpoint(0), running=2)
    c.shards[0] = st
    c.flight.dispatched += 2
    st.move(ShardState.RELEASING)
    c.requeue([job(0), job(1)], c.flight.new_slot())
    assert len(c.due) == 0 and st.running == 0 and c.flight.in_flight() == 0


def test_an_async_handler_of_a_kind_paused_after_hand_over_is_held_not_awaited():
    import asyncio

    from scheduler.domain.flow import Limits
    from scheduler.poller.aio import AsyncWorkers
    from scheduler.poller.flowqueue import HELD

    c = core()
    c.due.set_limits(Limits("p", paused=True), None, None)
    awaited: list[str] = []

    async def handler(j: Job) -> None:
        awaited.append(j.job_id)

    app = App.for_function(handler)
    workers = AsyncWorkers(c, app)
    try:
        asyncio.run(workers._fire(job(0, kind="p"), app.resolve("p"), None))
        assert awaited == [] and [(o.error, o.skip) for o in workers._pending] == [(HELD, "wait")]
    finally:
        workers.loop.close()


def test_a_recalled_row_handed_back_leaves_at_its_due_time_not_its_placed_time():
    c = core()
    c.shards[0] = OwnedShard(ShardProgress(0, 60, Checkpoint(0)), 1, Checkpoint(0), running=1)
    now = SystemClock().now_ms()
    recalled = job(0).evolve(due_ms=now - 5000, fire_ms=now + 50_000)  # placed later, taken back
    c.flight.dispatched += 1
    c.requeue([recalled], c.flight.new_slot())
    assert [j.job_id for j in c.due.pop_ready(now, 10)] == ["j0000"]


def test_a_placement_never_lands_on_a_position_the_shards_progress_still_holds():
    """A row recalled twice left two positions taken early (complete, not yet passed by
    the cursor); placed again at the first, the job's new row would be counted as that
    one and never fire. It moves on to the first position the progress does not hold."""
    c = core()
    progress = ShardProgress(0, 60, Checkpoint(0))
    c.shards[0] = OwnedShard(progress, 1, Checkpoint(0))
    at = SystemClock().now_ms() + 50_000
    bucket = at // 1000 // 60 * 60
    now_at = job(0).evolve(fire_ms=at + 1, bucket=bucket)
    for fire in (at, at + 1):
        assert progress.take_early(bucket, (fire, now_at.job_id))
        progress.complete(bucket, (fire, now_at.job_id))
    later = Recorder(c).retry_job(now_at, at, attempt=False)
    assert (later.fire_ms, later.bucket, later.shard) == (at + 2, bucket_of_ms(at + 2, 60), 0)
    assert later.attempts == now_at.attempts
