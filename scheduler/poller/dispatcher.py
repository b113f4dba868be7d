"""The dispatcher: sleeps until the oldest queued job is due by the wall clock, then
hands it to the handlers (worker threads, or the event loop of an async app), within
the dispatch-rate bounds and the in-flight cap.

A job leaves the due queue only when ``now >= fire time`` by the poller's clock, only
while the lease holds, and never while firing is refused (clock skew) or stopping.
"""

from __future__ import annotations

from typing import Protocol

from ..domain.model import OCCURRENCE_PREFIX, Job
from .shared import Core

# Occurrences dispatched fewer than this at once wait up to GATE_LINGER_S for more, so
# that one schedule read serves several (at 1,000 due per second: about five).
GATE_BATCH = 16
GATE_LINGER_S = 0.005


class Runner(Protocol):
    """Where dispatched jobs run: ``ThreadWorkers`` or ``AsyncWorkers``."""

    def chunk_size(self, due: int) -> int:
        """How many of ``due`` jobs to hand over in one ``submit``."""

    def submit(self, jobs: list[Job]) -> None: ...


def due_jobs(core: Core) -> list[Job]:
    """Take the jobs that may fire now (due, within rate and in-flight bounds) and count
    them as dispatched; the caller must run or requeue every one. A function of the core
    alone, so that an async app's loop can take jobs itself (``AsyncWorkers.take``)
    without a dispatcher to exist first."""
    if not core.lease():
        return []
    flight = core.flight
    with core.cond:
        free = flight.cap - flight.in_flight()
        if core.paused_reason is not None or core.stopping.is_set() or free <= 0:
            return []
        jobs = core.due.pop_ready(core.clock.now_ms(), free)
        flight.dispatched += len(jobs)
        shards = core.shards
        for job in jobs:
            st = shards.get(job.shard)
            if st is not None:
                st.running += 1
        if core.due.throttled:
            core.metrics.throttled.inc(core.due.throttled)
            core.due.throttled = 0
        return jobs


class Dispatcher:
    def __init__(self, core: Core, runner: Runner) -> None:
        self.core = core
        self.runner = runner

    def due_jobs(self) -> list[Job]:
        """See ``due_jobs``."""
        return due_jobs(self.core)

    def run(self) -> None:
        """The dispatch thread's body, until the poller stops."""
        core, runner, flight = self.core, self.runner, self.core.flight
        while not core.stopping.is_set():
            jobs = self.due_jobs()
            if jobs and core.pregate is not None and any(j.job_id.startswith(OCCURRENCE_PREFIX)
                                                         for j in jobs):
                # Recurring occurrences: their schedules read once for everything due
                # within a few ms, instead of once per worker's chunk.
                if len(jobs) < GATE_BATCH and not core.stopping.wait(GATE_LINGER_S):
                    jobs += self.due_jobs()
                core.pregate(jobs)
            if jobs:
                size = runner.chunk_size(len(jobs))
                for i in range(0, len(jobs), size):
                    runner.submit(jobs[i:i + size])
                continue
            # Set the flag before looking, so a worker finishing meanwhile wakes us.
            flight.free.clear()
            flight.want = True
            if flight.in_flight() > flight.refill_at:
                flight.free.wait(0.05)
                flight.want = False
                continue
            flight.want = False
            with core.cond:
                wait = core.due.next_wake_s(core.clock.now_ms())
                core.cond.wait(min(wait, core.config.poll_interval_s))
