"""The poller's side of recurring schedules (the rules are in ``recurring/chain.py``):

- ``write_successors``, in the reader, for each occurrence read: write the next one
  before the read is applied, so it exists before this one's handler can run, and a
  crash before this one is recorded makes the next owner read it and write it again.
- ``gate``, in a worker, just before the handlers of a chunk: read the schedules as
  they are now and fire, skip (superseded, paused, misfire, overlap) or let each
  occurrence wait. Its reads refresh the cache the reader uses. ``pregate``, in the
  dispatcher, makes the same decisions for everything dispatched at once, with one read.
"""

from __future__ import annotations

import threading
import time
from typing import TypeVar

from ..domain.dispatch import Outcome
from ..domain.effects import Steps, run_sync
from ..domain.model import DEFAULT_MAX_PAYLOAD_BYTES, OCCURRENCE_PREFIX, Job, Status
from ..errors import SchedulerError
from ..producer import occurrences as writes
from ..producer.producer import Producer
from ..recurring import chain
from ..recurring.schedule import (
    Occurrence,
    Overlap,
    Schedule,
    State,
    occurrence_id,
    parse_occurrence,
)
from .shared import Core

T = TypeVar("T")

BUFFERED = "buffered: waiting for the previous run"
# How soon a waiting occurrence (buffer_one, or a schedule that could not be read) is
# dispatched again.
WAIT_MS = 1000
WAIT = "wait"
# How many earlier occurrences the overlap policies look at: a run longer than this
# many intervals is not seen (documented).
OVERLAP_LOOKBACK = 8


# The reader may use a schedule read this long ago to write a successor: a stale one
# costs at most one occurrence row that the gate (which reads afresh) then skips, and
# that gate's read refreshes the cache, which ends the chain at the next read. Longer
# than a minute, so that the gate's read of occurrence N serves the read of N+1 for
# schedules every minute: one schedule read per occurrence, not two.
SCHEDULE_CACHE_S = 120.0
# About 1 KB each: 100 MB at most. Past it, the least recently read go first.
SCHEDULE_CACHE_MAX = 100_000
# A decision of ``pregate`` is used by a worker this long after its read began (real
# time); older, the worker reads again (its chunk waited behind slow handlers). A
# schedule change waits this long before it returns (producer/recurring.py), so no decision
# made before the change is used after it returned.
PREGATE_FRESH_S = chain.DECISION_FRESH_S
DECIDED_MAX = 10_000


class Occurrences:
    def __init__(self, core: Core) -> None:
        self.core = core
        self._producer: Producer | None = None
        self._cache: dict[str, tuple[float, Schedule | None]] = {}
        self._cache_lock = threading.Lock()
        self._decided: dict[str, tuple[float, Outcome | None]] = {}

    @property
    def producer(self) -> Producer:
        """Placement and writes as a producer does them (layout marks, late writes,
        slow-write repair), from what the poller holds: the keyspace's settings it read
        at its start, its clock, and its config: the layout cache's age is the shorter of
        its layout refresh period and ``layout_cache_ttl_s``, and it nudges unless
        ``nudge`` is False (no environment read, no store read). No retries
        (``retry_s=0``): a store error fails the read, which is done again."""
        if self._producer is None:
            config = self.core.config
            ttl = config.layout_refresh_s
            if config.layout_cache_ttl_s is not None:
                ttl = min(ttl, config.layout_cache_ttl_s)
            # The payload bound is never checked here: an occurrence's payload is the
            # schedule's, checked when the schedule was written.
            self._producer = Producer(self.core.meta, self.core.clock,
                                      max_payload_bytes=DEFAULT_MAX_PAYLOAD_BYTES,
                                      layout_cache_ttl_s=ttl, retry_s=0,
                                      nudge=config.nudge is not False)
        return self._producer

    def close(self) -> None:
        """Close the sockets the writer's producer opened to nudge owners; never raises."""
        producer = self._producer
        if producer is not None and producer.nudger is not None:
            producer.nudger.close()

    def _run(self, steps: Steps[T]) -> T:
        return run_sync(self.core.store, steps)

    def write_successors(self, rows: list[Job]) -> None:
        """Write the next occurrence of every occurrence among ``rows``. A store error
        propagates: the read is not applied and is done again."""
        occs = [occ for _, occ in _occurrences(rows)]
        if not occs:
            return
        schedules = self._schedules(occs)
        now = self.core.clock.now_ms()
        jobs: dict[str, Job] = {}
        for occ in occs:
            s = schedules.get(occ.schedule_id)
            for nominal in chain.successors(s, occ, now):
                assert s is not None
                job = self._run(writes.place(self.producer, s, nominal, now))
                jobs[job.job_id] = job
        self._run(writes.write(self.producer, list(jobs.values())))

    def _schedules(self, occs: list[Occurrence]) -> dict[str, Schedule | None]:
        """The occurrences' schedules, from the cache when it says the occurrence is
        current and active (a stale "active" costs at most a row the gate skips); read
        afresh otherwise (a stale "paused" or an older version would end the chain)."""
        mono = self.core.clock.monotonic()
        cache = self._cache
        out: dict[str, Schedule | None] = {}
        # Decided per schedule, not per occurrence: one read may hold two versions of a
        # schedule (the old chain's next row and an update's first one at the same time).
        # A cached old version serves the old row, but it must not serve the new one,
        # whose successor it would never write: the chain would end there.
        missing: dict[str, None] = {}
        for occ in occs:
            sid = occ.schedule_id
            hit = cache.get(sid)
            if (hit is not None and mono - hit[0] < SCHEDULE_CACHE_S and hit[1] is not None
                    and hit[1].state is State.ACTIVE and chain.current(hit[1], occ)):
                out[sid] = hit[1]
            else:
                missing[sid] = None
        if missing:
            out.update(self._read(list(missing)))
        return out

    def _read(self, schedule_ids: list[str]) -> dict[str, Schedule | None]:
        """Read these schedules afresh (None: deleted for good), and cache what was read.
        A store error propagates."""
        found = self.core.store.get_schedules(schedule_ids)
        out = {sid: found.get(sid) for sid in schedule_ids}
        mono = self.core.clock.monotonic()
        cache = self._cache
        with self._cache_lock:
            for sid, s in out.items():
                cache.pop(sid, None)  # re-inserted last: the dict's order is the age
                cache[sid] = (mono, s)
            while len(cache) > SCHEDULE_CACHE_MAX:
                del cache[next(iter(cache))]
        return out

    def _previous(self, occ: Occurrence, times: list[int]) -> chain.Previous:
        """Whether an earlier occurrence of the same version is still running (or waiting
        for a retry) or buffered: any of the last ``OVERLAP_LOOKBACK`` still pending (the
        ones skipped in between are complete, so a run longer than an interval is seen)."""
        ids = [occurrence_id(occ.schedule_id, occ.version, t) for t in times]
        pending = [j for j in self.core.store.get_many(ids).values() if j.status is Status.PENDING]
        if any((j.last_error or "").startswith(BUFFERED) for j in pending):
            return chain.Previous.WAITING
        return chain.Previous.RUNNING if pending else chain.Previous.DONE

    def pregate(self, jobs: list[Job]) -> None:
        """Decide the occurrences among ``jobs`` now, with one read, for ``gate`` to use
        while the decisions are fresh: the dispatcher calls this for all it dispatches
        at once, instead of a read per worker's chunk (one or two jobs each at a steady
        rate). A store error decides nothing: the workers' gate reads again."""
        occs = _occurrences(jobs)
        if not occs:
            return
        mono = time.monotonic()  # before the read: a change acknowledged after it may be missed
        try:
            decided = self._decide(occs)
        except SchedulerError:
            return
        with self._cache_lock:
            if len(self._decided) > DECIDED_MAX:
                self._decided.clear()  # left by jobs handed back at a stop
            for job, _ in occs:
                self._decided[job.job_id] = (mono, decided.get(job.job_id))

    def gate(self, jobs: list[Job]) -> dict[str, Outcome]:
        """The occurrences among ``jobs`` that must not fire now, by job id, with the
        outcome of skipping them or letting them wait; every other job fires. Their
        schedules were read at most ``PREGATE_FRESH_S`` ago (``pregate``) or are read
        afresh, together, just before the first of these handlers runs (a worker hands
        back the rest of a chunk that ran longer than a few ms, and the rest is read
        again). When the store cannot be read, every occurrence waits: firing one that
        may have been deleted is not safe."""
        occs = _occurrences(jobs)
        if not occs:
            return {}
        out: dict[str, Outcome] = {}
        if self._decided:
            mono = time.monotonic()
            todo = []
            with self._cache_lock:
                for job, occ in occs:
                    d = self._decided.pop(job.job_id, None)
                    if d is None or mono - d[0] > PREGATE_FRESH_S:
                        todo.append((job, occ))
                    elif d[1] is not None:
                        out[job.job_id] = d[1]
            occs = todo
        if not occs:
            return out
        try:
            return out | self._decide(occs)
        except SchedulerError as exc:
            self.core.store_fault.failed(exc)
            now = self.core.clock.now_ms()
            return out | {job.job_id: Outcome(job, False, f"waiting: the schedule could not be read ({exc})",
                                              now + WAIT_MS, False, now, WAIT) for job, _ in occs}

    def _decide(self, occs: list[tuple[Job, Occurrence]]) -> dict[str, Outcome]:
        """Read the schedules afresh and decide; only the skips and waits are returned.
        A store error propagates."""
        core = self.core
        now = core.clock.now_ms()
        out: dict[str, Outcome] = {}
        schedules = self._read(list(dict.fromkeys(occ.schedule_id for _, occ in occs)))
        for job, occ in occs:
            s = schedules[occ.schedule_id]
            previous = chain.Previous.DONE
            if s is not None and s.overlap is not Overlap.ALLOW and chain.current(s, occ):
                previous = self._previous(occ, s.rule.before(occ.nominal_ms, OVERLAP_LOOKBACK))
            d = chain.decide(s, occ, now, previous)
            if d.wait:
                out[job.job_id] = Outcome(job, False, BUFFERED, now + WAIT_MS, False, now, WAIT)
            elif not d.fire:
                out[job.job_id] = Outcome(job, False, f"skipped: {d.skip}", None, False, now, str(d.skip))
        return out


def _occurrences(jobs: list[Job]) -> list[tuple[Job, Occurrence]]:
    return [(job, occ) for job in jobs
            if job.job_id.startswith(OCCURRENCE_PREFIX) and (occ := parse_occurrence(job.job_id))]
