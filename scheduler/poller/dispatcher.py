"""The dispatcher: sleeps until the oldest queued job is due by the wall clock, then
hands it to the handlers (worker threads, or the event loop of an async app), within
the dispatch-rate bounds and the in-flight cap.

A job leaves the due queue only when ``now >= fire time`` by the poller's clock, only
while the lease holds, and never while firing is refused (clock skew) or stopping.
"""

from __future__ import annotations

import queue
from typing import Protocol

from ..domain.dispatch import Outcome
from ..domain.model import OCCURRENCE_PREFIX, Job
from .occurrences import WAIT
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

    def handed_over(self) -> int:
        """Chunks submitted that no worker has taken yet (0 where none wait: a loop)."""


def due_jobs(core: Core) -> list[Job]:
    """Take the jobs that may fire now (due, within rate and in-flight bounds) and count
    them as dispatched; the caller must run or requeue every one. A function of the core
    alone, so that an async app's loop can take jobs itself (``AsyncWorkers.take``)
    without a dispatcher to exist first."""
    if not core.lease() or not core.flow_ready.is_set():
        return []
    flight = core.flight
    with core.cond:
        if core.paused_reason is not None or core.stopping.is_set():
            return []
        now = core.clock.now_ms()
        queue = core.due
        _count_ended(core)
        # Called with no room too: due jobs still move to the fair stage, where a
        # throttled kind's excess is found and placed later (see flowqueue.py).
        jobs = queue.pop_ready(now, flight.cap - flight.in_flight())
        flight.dispatched += len(jobs)
        shards = core.shards
        for job in jobs:
            st = shards.get(job.shard)
            if st is not None:
                st.running += 1
        if queue.throttled:
            core.metrics.throttled.inc(queue.throttled)
            queue.throttled = 0
        _count_refusals(core)
        _place_later(core, now)
        return jobs


def _count_ended(core: Core) -> None:
    """Free the flow-control slots of handlers that returned (``Core.handled``); each job
    is counted once, here or by the recorder, whichever sees it first."""
    returned, finished_many = core.returned, core.due.finished_many
    while True:
        try:
            outcomes = returned.get_nowait()
        except queue.Empty:
            return
        finished_many(o.job for o in outcomes)


def _count_refusals(core: Core) -> None:
    refused = core.due.fair.throttled
    if refused:
        for (kind, reason), n in refused.items():
            if reason != "paused":  # held jobs have their own gauge
                core.metrics.throttled_kind.labels(kind, reason).inc(n)
        refused.clear()


def _place_later(core: Core, now: int) -> None:
    """Hand a throttled or paused kind's excess to the recorder, which places each job
    later as it does a recurring occurrence that waits: its row completes (the checkpoint
    passes it) and the job is read again at its new time. Caller holds ``core.cond``."""
    excess = core.due.excess(now)
    if not excess:
        return
    outcomes = []
    for job, at_ms, why in excess:
        st = core.shards.get(job.shard)
        if st is None:
            continue  # its shard was given up: its row stays for the next owner
        st.running += 1  # the recorder counts it down, as for a dispatched job
        outcomes.append(Outcome(job, False, why, at_ms, False, now, WAIT))
        if why.startswith("deferred"):
            core.metrics.deferred.labels(job.kind).inc()
    if outcomes:
        core.outcomes.put(outcomes)


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
            if flight.in_flight() > flight.refill_at and runner.handed_over():
                # More than half the cap in flight, and chunks still waiting for a worker:
                # wait until the workers drain to half, then take a half at once. Taking
                # the few slots freed since the last take handed chunks of two jobs to the
                # workers (a hand-off each), and kept due jobs in the work queue instead
                # of the fair queue, where priority orders them. (With nothing waiting,
                # what is in flight runs, on an event loop say: take what is free.)
                self._wait_free()
                continue
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
            if flight.in_flight() > flight.refill_at:
                self._wait_free()
                continue
            with core.cond:
                wait = core.due.next_wake_s(core.clock.now_ms())
                core.cond.wait(min(wait, core.config.poll_interval_s))

    def _wait_free(self) -> None:
        """Until the workers bring the jobs in flight down to the refill mark (at most
        50 ms: a stop is seen within that)."""
        flight = self.core.flight
        # Set the flag before looking, so a worker finishing meanwhile wakes us.
        flight.free.clear()
        flight.want = True
        if flight.in_flight() > flight.refill_at:
            flight.free.wait(0.05)
        flight.want = False
