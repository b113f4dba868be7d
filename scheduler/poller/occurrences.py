"""The poller's side of recurring schedules (the rules are in ``recurring/chain.py``):

- ``write_successors``, in the reader, for each occurrence read: write the next one
  before the read is applied, so it exists before this one's handler can run, and a
  crash before this one is recorded makes the next owner read it and write it again.
- ``gate``, in a worker, just before the handler: read the schedule as it is now and
  fire, skip (superseded, paused, misfire, overlap) or let the occurrence wait.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..dispatch import Outcome
from ..errors import SchedulerError
from ..model import OCCURRENCE_PREFIX, Job, Status
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

if TYPE_CHECKING:
    from ..client import Client

BUFFERED = "buffered: waiting for the previous run"
# How soon a waiting occurrence (buffer_one, or a schedule that could not be read) is
# dispatched again.
WAIT_MS = 1000
WAIT = "wait"
# How many earlier occurrences the overlap policies look at: a run longer than this
# many intervals is not seen (documented).
OVERLAP_LOOKBACK = 8


# The reader may use a schedule read this long ago to write a successor: a stale one
# costs at most one occurrence row that the gate (which reads afresh) then skips.
SCHEDULE_CACHE_S = 10.0
SCHEDULE_CACHE_MAX = 50_000


class Occurrences:
    def __init__(self, core: Core) -> None:
        self.core = core
        self._client: Client | None = None
        self._cache: dict[str, tuple[float, Schedule | None]] = {}

    @property
    def client(self) -> Client:
        """Placement and writes as a producer does them (layout marks, late writes)."""
        if self._client is None:
            from ..client import Client

            self._client = Client(self.core.store, clock=self.core.clock, retry_s=0)
        return self._client

    def write_successors(self, rows: list[Job]) -> None:
        """Write the next occurrence of every occurrence among ``rows``. A store error
        propagates: the read is not applied and is done again."""
        occs = [(row, occ) for row in rows
                if row.job_id.startswith(OCCURRENCE_PREFIX) and (occ := parse_occurrence(row.job_id))]
        if not occs:
            return
        core = self.core
        schedules = self._schedules([occ for _, occ in occs])
        now = core.clock.now_ms()
        jobs: dict[str, Job] = {}
        for _, occ in occs:
            s = schedules.get(occ.schedule_id)
            for nominal in chain.successors(s, occ, now):
                assert s is not None
                job = self.client.place_occurrence(s, nominal, now)
                jobs[job.job_id] = job
        self.client.write_jobs(list(jobs.values()))

    def _schedules(self, occs: list[Occurrence]) -> dict[str, Schedule | None]:
        """The occurrences' schedules, from the cache when it says the occurrence is
        current and active (a stale "active" costs at most a row the gate skips); read
        afresh otherwise (a stale "paused" or an older version would end the chain)."""
        mono = self.core.clock.monotonic()
        cache = self._cache
        out: dict[str, Schedule | None] = {}
        missing = []
        for occ in occs:
            sid = occ.schedule_id
            hit = cache.get(sid)
            if (hit is not None and mono - hit[0] < SCHEDULE_CACHE_S and hit[1] is not None
                    and hit[1].state is State.ACTIVE and chain.current(hit[1], occ)):
                out[sid] = hit[1]
            elif sid not in out:
                missing.append(sid)
        if missing:
            found = self.core.store.get_schedules(missing)
            if len(cache) + len(missing) > SCHEDULE_CACHE_MAX:
                cache.clear()
            for sid in dict.fromkeys(missing):
                out[sid] = found.get(sid)
                cache[sid] = (mono, out[sid])
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

    def gate(self, job: Job) -> Outcome | None:
        """None to fire ``job`` now; else the outcome of skipping it or letting it wait.
        When the store cannot be read, the occurrence waits: firing one that may have
        been deleted is not safe."""
        occ = parse_occurrence(job.job_id)
        if occ is None:
            return None
        core = self.core
        store = core.store
        now = core.clock.now_ms()
        try:
            s = store.get_schedules([occ.schedule_id]).get(occ.schedule_id)
            previous = chain.Previous.DONE
            if s is not None and s.overlap is not Overlap.ALLOW and chain.current(s, occ):
                previous = self._previous(occ, s.rule.before(occ.nominal_ms, OVERLAP_LOOKBACK))
        except SchedulerError as exc:
            core.store_fault.failed(exc)
            return Outcome(job, False, f"waiting: the schedule could not be read ({exc})",
                           now + WAIT_MS, False, now, WAIT)
        d = chain.decide(s, occ, now, previous)
        if d.fire:
            return None
        if d.wait:
            return Outcome(job, False, BUFFERED, now + WAIT_MS, False, now, WAIT)
        return Outcome(job, False, f"skipped: {d.skip}", None, False, now, str(d.skip))
