"""Worker threads: run plain (sync) handlers, and free the slot of one that hangs.

Each worker takes a chunk of due jobs from the work queue and runs their handlers in
order; their outcomes go to the recorder together. A chunk running longer than
``CHUNK_HANDBACK_S`` hands its unstarted jobs back for an idle worker, so a slow handler
holds up at most itself.

**Timeouts.** A Python thread cannot be killed. The watchdog (one thread, every
``WATCHDOG_TICK_S``) finds a handler running past its timeout and *abandons* its worker:
the job's attempt is recorded as failed ("timed out after N s": retried or dead-lettered
by the kind's policy), the chunk's unstarted jobs go back to the queue, and a new worker
takes the slot, so the poller keeps firing at full rate. The hung call keeps running in
its abandoned thread; whatever it returns or raises later is discarded (and logged).
It may still have its side effects: a timed-out job can run twice, like any retry. Its
flow-control slots (its kind's concurrency, its key's) stay taken until it returns: a
limit counts handlers running, not outcomes recorded. At
most ``max_abandoned_threads`` abandoned threads may be alive at once; one more fails
the poller, so that its supervisor starts a fresh process and the hung threads go with
the old one.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from typing import Any

from ..domain.dispatch import App, Outcome, Route, failed, run_route
from ..domain.model import Job
from ..observe import tracing
from ..observe.faults import Summarised
from .flowqueue import HELD, HOLD_S
from .occurrences import WAIT
from .shared import Core

log = logging.getLogger("scheduler.poller")

# Due jobs handed to one worker at once, at most, and how long a worker runs such a
# chunk before handing its unstarted jobs back.
MAX_CHUNK = 32
CHUNK_HANDBACK_S = 0.005
WATCHDOG_TICK_S = 0.01
NO_LIMIT = float("inf")


class _Worker:
    """One worker thread's state, read by the watchdog. ``lock`` decides who records the
    outcome of the running job: the worker when its handler returns, or the watchdog
    when it times out first."""

    __slots__ = ("abandoned", "chunk", "deadline", "done", "holds_slot", "index", "job", "lock",
                 "slot", "span", "timeout")

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.lock = threading.Lock()
        self.job: Job | None = None  # running a handler for this job
        self.deadline = NO_LIMIT  # time.monotonic() past which it has timed out
        self.timeout = NO_LIMIT
        self.chunk: list[Job] = []
        self.index = 0
        self.done: list[Outcome] = []
        self.abandoned = False
        self.holds_slot = False  # abandoned with its flow-control slots taken
        self.span: tracing.AttemptSpan | None = None  # the running job's, when tracing


class ThreadWorkers:
    def __init__(self, core: Core, app: App) -> None:
        self.core, self.app = core, app
        self.size = core.config.concurrency
        default = core.config.handler_timeout_s
        self.default_timeout = NO_LIMIT if default is None else default
        self.work: queue.SimpleQueue[list[Job] | None] = queue.SimpleQueue()
        # Whether recent handlers ran in under CHUNK_HANDBACK_S / MAX_CHUNK each: only
        # then are due jobs handed out in chunks. Written by workers without a lock
        # (a hint; a stale value costs a little speed, never a job).
        self.fast = True
        self.live: list[_Worker] = []
        self.threads: list[threading.Thread] = []
        self.abandoned_alive = 0
        self._lock = threading.Lock()
        self._rand = random.Random()
        self._inline = _Worker(0)  # Poller.fire, in the caller's thread, not watched
        self._timeouts = Summarised(log, "handler_timed_out")
        # Attempt spans (observe.tracing); None, so one test per job, while tracing is off.
        self.trace = tracing.attempts()

    # --- the dispatcher's side ------------------------------------------------------

    def chunk_size(self, due: int) -> int:
        # Due jobs beyond one per worker go out in chunks: one hand-off (a queue
        # operation and a thread wake-up) per chunk instead of per job. Only when more
        # are due than there are workers, so no job waits that one could run. Only
        # while handlers are fast: slow ones are better spread one by one.
        return min(MAX_CHUNK, max(1, due // self.size)) if self.fast else 1

    def submit(self, jobs: list[Job]) -> None:
        self.work.put(jobs)

    def handed_over(self) -> int:
        return self.work.qsize()

    def _unstarted(self) -> list[Job]:
        """Take every chunk waiting in the work queue (a stop's end markers stay)."""
        out: list[Job] = []
        ends = 0
        while True:
            try:
                chunk = self.work.get_nowait()
            except queue.Empty:
                break
            if chunk is None:
                ends += 1
            else:
                out += chunk
        for _ in range(ends):
            self.work.put(None)
        return out

    def fire_inline(self, jobs: list[Job]) -> list[Outcome]:
        """Run handlers in the caller's thread (no timeout applies)."""
        return self.fire_chunk(jobs, self._inline)

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        for _ in range(self.size):
            self._spawn()
        self.threads.append(self.core.start_thread("watchdog", self._watch))

    def _spawn(self) -> None:
        w = _Worker(self.core.flight.new_slot())
        with self._lock:
            self.live.append(w)
        self.threads.append(self.core.start_thread("worker", lambda: self._run(w), f"w{w.slot}"))

    def stop(self) -> None:
        """Hand back the jobs not started yet (they stay unfired in the store), then end
        every live worker once its current chunk is done."""
        try:
            while (chunk := self.work.get_nowait()) is not None:
                self.core.flight.finished[0] += len(chunk)
        except queue.Empty:
            pass
        with self._lock:
            n = len(self.live)
        for _ in range(n):
            self.work.put(None)

    # --- a worker -------------------------------------------------------------------

    def _run(self, w: _Worker) -> None:
        while (jobs := self.work.get()) is not None:
            if not self.core.lease():
                # Ownership is in doubt (a freeze, a suspended connection): do not fire.
                self.core.requeue(jobs, w.slot)
                continue
            self.fire_chunk(jobs, w)
            if w.abandoned:
                return

    def fire_chunk(self, jobs: list[Job], w: _Worker) -> list[Outcome]:
        """Run the handlers of ``jobs`` in order and queue their outcomes together."""
        core, resolve = self.core, self.app.resolve
        now_ms, rand, finished, slot = core.clock.now_ms, self._rand.random, core.flight.finished, w.slot
        mono, default, lock, trace = time.monotonic, self.default_timeout, w.lock, self.trace
        done: list[Outcome] = []
        w.done, w.chunk = done, jobs
        # Recurring occurrences: their schedules read once for the chunk (see gate).
        skips = core.gate(jobs) if core.gate is not None else None
        started = mono()
        try:
            for i, job in enumerate(jobs):
                if i and mono() - started > CHUNK_HANDBACK_S:
                    # Handlers are slow now: this chunk's unstarted jobs, and those of the
                    # chunks still waiting in the work queue, go back to the poller's
                    # queue, where they wait their turn by priority again and are handed
                    # out one by one; left in the work queue, each chunk would start its
                    # first job ahead of higher priorities.
                    core.requeue(jobs[i:] + self._unstarted(), slot)
                    self.fast = False
                    break
                if skips and (skipped := skips.get(job.job_id)) is not None:
                    done.append(skipped)
                    finished[slot] += 1
                    continue
                if core.due.paused and job.kind in core.due.paused:
                    # Paused after it was handed over: held, as the dispatcher holds one.
                    now = now_ms()
                    done.append(Outcome(job, False, HELD, now + int(HOLD_S * 1000), False, now, WAIT))
                    finished[slot] += 1
                    continue
                route = resolve(job.kind)
                timeout = default if isinstance(route, str) or route.timeout_s is None else route.timeout_s
                # The watchdog reads ``job`` first, so the deadline (and span) are set before it.
                w.timeout, w.deadline, w.index = timeout, mono() + timeout, i
                w.span = span = None if trace is None else trace.start(job)
                w.job = job
                outcome = run_route(route, job, now_ms, rand)
                with lock:
                    if w.abandoned:  # the watchdog recorded this job as timed out
                        if span is not None:
                            span.leave()  # ended by the watchdog, with the timeout
                        self._returned(w, job, outcome, mono() - w.deadline + timeout)
                        return done
                    w.job = None
                    done.append(outcome)
                if span is not None:
                    span.finish(outcome)
                finished[slot] += 1  # only this thread writes this slot
        finally:
            if done and not w.abandoned:
                core.handled(done)
                if len(done) == len(jobs):
                    self.fast = (mono() - started) / len(jobs) < CHUNK_HANDBACK_S / MAX_CHUNK
            core.flight.some_done()
        return done

    def _returned(self, w: _Worker, job: Job, outcome: Outcome, ran_s: float) -> None:
        if w.holds_slot:
            with self.core.cond:
                self.core.due.finished(job)
                self.core.cond.notify_all()
        with self._lock:
            self.abandoned_alive -= 1
        self.core.metrics.abandoned_threads.set(self.abandoned_alive)
        log.info("the timed-out handler of job %s returned after %.1f s (%s); its result is discarded",
                 job.job_id, ran_s, "ok" if outcome.ok else outcome.error,
                 extra={"action": "abandoned_handler_returned", "job_id": job.job_id})

    # --- the watchdog ---------------------------------------------------------------

    def _watch(self) -> None:
        core = self.core
        while not core.stopped.wait(WATCHDOG_TICK_S):
            now = time.monotonic()
            for w in list(self.live):
                if w.job is not None and now >= w.deadline:
                    self._abandon(w)

    def _abandon(self, w: _Worker) -> None:
        """Record ``w``'s job as timed out and replace ``w`` (see the module's docstring)."""
        core = self.core
        with w.lock:
            job = w.job
            if job is None or time.monotonic() < w.deadline:
                return  # it returned meanwhile
            w.abandoned = True
            w.job = None
            done, rest, timeout, span = w.done, w.chunk[w.index + 1:], w.timeout, w.span
            # Under w.lock (then cond, the order _returned takes them in): a handler that
            # returns now finds the slot held, and frees it.
            with core.cond:
                w.holds_slot = core.due.outlive(job)
        route: Any = self.app.resolve(job.kind)
        assert isinstance(route, Route)
        now = core.clock.now_ms()
        error = f"timed out after {timeout:g} s"
        outcome = failed(route, job, error, now - int(timeout * 1000), now, self._rand.random)
        if span is not None:
            span.end(outcome)
        core.flight.finished[w.slot] += 1  # the abandoned thread never writes it again
        if done:
            core.handled(done)
        # Not to flow control's returned handlers: the recorder frees one count, the
        # abandoned thread the other when (if) it returns (``_returned``).
        core.outcomes.put([outcome])
        if rest:
            self.work.put(rest)
        self.fast = False
        with self._lock:
            self.live.remove(w)
            self.abandoned_alive += 1
            alive = self.abandoned_alive
        core.stats.timed_out += 1
        core.stats.abandoned_threads += 1
        core.metrics.handler_timeouts.labels(job.kind).inc()
        core.metrics.abandoned_threads.set(alive)
        self._timeouts.event(f"the handler of job {job.job_id} ({job.kind}) {error}: attempt "
                             f"recorded as failed, its thread abandoned ({alive} alive)")
        cap = core.config.max_abandoned_threads
        if alive > cap:
            core.fail("worker", f"{alive} handler threads hung past their timeouts (the cap is {cap})")
        elif not core.stopping.is_set():
            self._spawn()
