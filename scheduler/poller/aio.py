"""Async handlers: coroutines on an event loop owned by the poller, in a thread of its
own. At most ``concurrency`` handlers run at once (a semaphore); the due jobs beyond
them wait on it, counted in flight like the jobs queued for worker threads.

A handler past its timeout is cancelled (``asyncio.timeout``): the attempt counts as
failed with "timed out after N s", and is retried or dead-lettered like any failure. A
coroutine that swallows the cancellation keeps its slot until it returns. Outcomes go to
the recorder in one batch per turn of the loop.
"""

from __future__ import annotations

import asyncio
import random
import threading

from ..dispatch import App, Outcome, failed, failure, refused
from ..model import Job
from .shared import Core


class AsyncWorkers:
    def __init__(self, core: Core, app: App) -> None:
        self.core, self.app = core, app
        self.size = core.config.concurrency
        self.default_timeout = core.config.handler_timeout_s
        self.loop = asyncio.new_event_loop()
        self.slot = core.flight.new_slot()  # written by the loop's thread only
        self.threads: list[threading.Thread] = []
        self._sem: asyncio.Semaphore | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: list[Outcome] = []
        self._flush_due = False
        self._rand = random.Random()

    # --- the dispatcher's side ------------------------------------------------------

    def chunk_size(self, due: int) -> int:
        return due  # one hand-off per batch: the loop starts them all

    def submit(self, jobs: list[Job]) -> None:
        self.loop.call_soon_threadsafe(self._spawn, jobs)

    def fire_inline(self, jobs: list[Job]) -> list[Outcome]:
        """Run handlers to completion in the caller's thread, on a loop of its own."""
        async def all_of() -> list[Outcome]:
            return [await self._outcome(job) for job in jobs]
        done = asyncio.run(all_of())
        self.core.flight.finished[0] += len(done)
        self.core.outcomes.put(done)
        return done

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self.threads.append(self.core.start_thread("event-loop", self._run_loop, "loop"))

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._sem = asyncio.Semaphore(self.size)
        try:
            self.loop.run_forever()
        finally:
            # Handlers still running after the shutdown timeout are cancelled: their
            # outcomes are not recorded, so their rows stay for the next owner.
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                self.loop.run_until_complete(asyncio.gather(*self._tasks, return_exceptions=True))
            self.loop.close()

    def stop(self) -> None:
        """Record what finished, then stop the loop (see ``_run_loop``)."""
        def last() -> None:
            self._flush()
            self.loop.stop()
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(last)

    # --- on the loop ----------------------------------------------------------------

    def _spawn(self, jobs: list[Job]) -> None:
        for job in jobs:
            task = self.loop.create_task(self._fire(job))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _fire(self, job: Job) -> None:
        assert self._sem is not None
        async with self._sem:
            if not self.core.lease():
                self.core.requeue([job], self.slot)  # ownership in doubt: do not fire
                return
            outcome = await self._outcome(job)
        self._pending.append(outcome)
        self.core.flight.finished[self.slot] += 1
        if not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self._flush)

    async def _outcome(self, job: Job) -> Outcome:
        core = self.core
        now_ms, rand = core.clock.now_ms, self._rand.random
        started = now_ms()
        route = self.app.resolve(job.kind)
        if isinstance(route, str):
            return refused(route, job, started)
        timeout = self.default_timeout if route.timeout_s is None else route.timeout_s
        try:
            async with asyncio.timeout(timeout):
                await route.handler(job)
        except TimeoutError:
            core.stats.timed_out += 1
            core.metrics.handler_timeouts.labels(job.kind).inc()
            return failed(route, job, f"timed out after {timeout:g} s", started, now_ms(), rand)
        except Exception as exc:  # a handler's failure is data, not a crash of the poller
            return failure(route, job, exc, started, now_ms(), rand)
        return Outcome(job, True, None, None, False, started)

    def _flush(self) -> None:
        self._flush_due = False
        batch, self._pending = self._pending, []
        if batch:
            self.core.outcomes.put(batch)
        self.core.flight.some_done()
