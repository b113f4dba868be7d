"""Async handlers: coroutines on an event loop owned by the poller, in a thread of its
own. At most ``concurrency`` handlers run at once: the in-flight cap is exactly that
(no jobs queued ahead, as for worker threads), so every job handed over starts at once.
(Not an ``asyncio.Semaphore``: in Python 3.11 each release scans every waiter, measured
at 60% of the loop's time with 5,000 handlers.)

A handler past its timeout is cancelled (a timer per job on the loop): the attempt counts
as failed with "timed out after N s", and is retried or dead-lettered like any failure. A
coroutine that swallows the cancellation keeps its slot until it returns. Outcomes go to
the recorder in one batch per turn of the loop.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Awaitable, Callable

from ..domain.dispatch import App, Outcome, Route, failed, failure, refused
from ..domain.model import OCCURRENCE_PREFIX, Job
from ..observe import tracing
from .flowqueue import HELD, HOLD_S
from .occurrences import WAIT
from .shared import Core


class AsyncWorkers:
    def __init__(self, core: Core, app: App, *, take: Callable[[], list[Job]] | None = None,
                 sets_cap: bool = True, on_close: Callable[[], Awaitable[None]] | None = None) -> None:
        """``take``: the dispatcher's ``due_jobs`` for this core (None: the loop waits
        for the dispatcher to hand jobs over). ``sets_cap``: the in-flight cap is this
        loop's concurrency (False: beside worker threads, the poller's cap stands).
        ``on_close``: awaited on the loop once its handlers are done, before it closes."""
        self.core, self.app = core, app
        self.size = core.config.concurrency
        if sets_cap:
            core.flight.cap = self.size
        self.on_close = on_close
        # The loop takes the next due jobs itself once handlers finish, without a round
        # trip through the dispatcher's thread (measured: 100-200 ms per refill with
        # 5,000 handlers, 10% of the rate).
        self.take = take
        self.default_timeout = core.config.handler_timeout_s
        self.loop = asyncio.new_event_loop()
        self.slot = core.flight.new_slot()  # written by the loop's thread only
        self.threads: list[threading.Thread] = []
        # Running tasks (strong references: the loop keeps only weak ones) and their
        # timeout timers; the tasks whose timer fired.
        self._timers: dict[asyncio.Task[None], asyncio.TimerHandle | None] = {}
        self._expired: set[asyncio.Task[None]] = set()
        self._pending: list[Outcome] = []
        self._flush_due = False
        self._rand = random.Random()
        # Attempt spans (observe.tracing); None, so one test per job, while tracing is off.
        self.trace = tracing.attempts()

    # --- the dispatcher's side ------------------------------------------------------

    def chunk_size(self, due: int) -> int:
        return due  # one hand-off per batch: the loop starts them all

    def submit(self, jobs: list[Job]) -> None:
        self.loop.call_soon_threadsafe(self._spawn, jobs)

    def handed_over(self) -> int:
        return 0  # the loop starts what it is given at once

    def fire_inline(self, jobs: list[Job]) -> list[Outcome]:
        """Run handlers to completion in the caller's thread, on a loop of its own."""
        skips = self.core.gate(jobs) if self.core.gate is not None else {}

        async def one(job: Job) -> Outcome:
            if (skipped := skips.get(job.job_id)) is not None:
                return skipped
            route = self.app.resolve(job.kind)
            span = None if self.trace is None else self.trace.start(job)
            started = self.core.clock.now_ms()
            if isinstance(route, str):
                outcome = refused(route, job, started)
            else:
                try:
                    await route.handler(job)
                    outcome = Outcome(job, True, None, None, False, started)
                except Exception as exc:  # a handler's failure is data
                    outcome = failure(route, job, exc, started, self.core.clock.now_ms(), self._rand.random)
            if span is not None:
                span.finish(outcome)
            return outcome

        async def all_of() -> list[Outcome]:
            return [await one(job) for job in jobs]
        done = asyncio.run(all_of())
        self.core.flight.finished[0] += len(done)
        self.core.handled(done)
        return done

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self.threads.append(self.core.start_thread("event-loop", self._run_loop, "loop"))

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            # Handlers still running after the shutdown timeout are cancelled: their
            # outcomes are not recorded, so their rows stay for the next owner.
            tasks = list(self._timers)
            for task in tasks:
                task.cancel()
            if tasks:
                self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            if self.on_close is not None:
                self.loop.run_until_complete(self.on_close())
            self.loop.close()

    def stop(self) -> None:
        """Record what finished, then stop the loop (see ``_run_loop``)."""
        def last() -> None:
            self._flush()
            self.loop.stop()
        if not self.threads:  # never started (a poller whose start failed): nothing ran on it
            self.loop.close()
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(last)

    # --- on the loop ----------------------------------------------------------------

    def _spawn(self, jobs: list[Job], skips: dict[str, Outcome] | None = None) -> None:
        # One timer per job, cancelled when it ends: cheaper than ``asyncio.timeout``
        # (a context object and a current-task look-up per job), which cost a fifth of
        # the loop's time at 5,000 handlers. The timeout counts from here.
        loop, resolve, default, timers, done = (self.loop, self.app.resolve, self.default_timeout,
                                                self._timers, self._done)
        if skips is None and self.core.gate is not None:
            occurrences = [j for j in jobs if j.job_id.startswith(OCCURRENCE_PREFIX)]
            if occurrences:
                # Their schedules are read first, together, off the loop (see gate).
                jobs = [j for j in jobs if not j.job_id.startswith(OCCURRENCE_PREFIX)]
                gated = loop.create_task(self._gated(occurrences))
                timers[gated] = None  # cancelled at shutdown like a handler
                gated.add_done_callback(done)
        now = loop.time()
        for job in jobs:
            route = resolve(job.kind)
            task = loop.create_task(self._fire(job, route, skips.get(job.job_id) if skips else None))
            limit = None if isinstance(route, str) else (default if route.timeout_s is None
                                                         else route.timeout_s)
            timers[task] = None if limit is None else loop.call_at(now + limit, self._expire, task)
            task.add_done_callback(done)

    def _done(self, task: asyncio.Task[None]) -> None:
        handle = self._timers.pop(task, None)
        if handle is not None:
            handle.cancel()
        if self._expired:
            self._expired.discard(task)
        # A task ends with an exception only when something escaped ``except Exception``
        # (a handler raising a BaseException, a bug here): its job would stay in flight
        # for ever, so the poller fails instead of running half-dead.
        if not task.cancelled() and (exc := task.exception()) is not None:
            self.core.fail("event-loop", f"the event-loop thread crashed: {type(exc).__name__}: {exc}",
                           exc)

    def _expire(self, task: asyncio.Task[None]) -> None:
        self._timers[task] = None
        self._expired.add(task)
        task.cancel()

    async def _gated(self, jobs: list[Job]) -> None:
        assert self.core.gate is not None
        skips = await self.loop.run_in_executor(None, self.core.gate, jobs)
        self._spawn(jobs, skips)

    async def _fire(self, job: Job, route: Route | str, skipped: Outcome | None) -> None:
        core = self.core
        if not core.lease():
            core.requeue([job], self.slot)  # ownership in doubt: do not fire
            return
        now_ms = core.clock.now_ms
        started = now_ms()
        if skipped is not None:
            outcome = skipped
        elif core.due.paused and job.kind in core.due.paused:
            # Paused after it was handed over: held, as the dispatcher holds one.
            outcome = Outcome(job, False, HELD, started + int(HOLD_S * 1000), False, started, WAIT)
        elif isinstance(route, str):
            outcome = refused(route, job, started)
            if self.trace is not None:
                self.trace.start(job).finish(outcome)
        else:
            span = None if self.trace is None else self.trace.start(job)
            try:
                await route.handler(job)
                outcome = Outcome(job, True, None, None, False, started)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task not in self._expired:
                    if span is not None:
                        span.finish(None)
                    raise  # the poller is shutting down
                task.uncancel()
                timeout = self.default_timeout if route.timeout_s is None else route.timeout_s
                core.stats.timed_out += 1
                core.metrics.handler_timeouts.labels(job.kind).inc()
                outcome = failed(route, job, f"timed out after {timeout:g} s", started, now_ms(),
                                 self._rand.random)
            except Exception as exc:  # a handler's failure is data, not a crash of the poller
                outcome = failure(route, job, exc, started, now_ms(), self._rand.random)
            if span is not None:
                span.finish(outcome)
        self._pending.append(outcome)
        core.flight.finished[self.slot] += 1
        if not self._flush_due:
            self._flush_due = True
            # After the other handlers that finish in this turn of the loop: one batch.
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        batch, self._pending = self._pending, []
        if batch:
            self.core.handled(batch)
        if self.take is not None and (jobs := self.take()):
            self._spawn(jobs)
        self.core.flight.some_done()
