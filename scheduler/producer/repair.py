"""Slow-write repair: what the producer does when a write was acknowledged too late for
the late-write rule (a slow node, a long pause, a fresh process's first statements).

The rule: a producer places a job at ``fire >= now + late_margin``, and a poller reads at
most ``late_margin - 2 * max_skew`` ahead of its clock. A write visible within
``max_skew`` of its placement therefore never lands behind a read cursor. A write
acknowledged later may have: the job is moved to a fresh position ahead of every cursor.

What a move costs, and how that is kept to at most one extra firing per job (usually
none): the moves of a call go out in one concurrent round; each new position leaves room
for the move's own write (twice the last write's time, at most ``SLACK_MAX_MS``), so a
job is moved again only when its move was much slower than the write before it; a row the store
shows fired or retired already is not moved (it was not lost, and moving a fired row
fires it again); and after each round the shard owners are told which rows were retired
(``Nudger.retire``), so one that queued an old row drops it instead of firing it."""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from ..domain.clock import Clock
from ..domain.effects import Steps, call
from ..domain.model import Job
from ..errors import SchedulerError
from ..store import StoreMeta
from .nudger import NUDGE_AHEAD_MS, Nudger

log = logging.getLogger("scheduler.client")

# Rounds at most (each only for jobs whose own move was slow).
ROUNDS = 5
# The most room a moved job gets for its move's own write: within the window in which
# its owner still takes a nudge (beyond it, the job would fire that much later).
SLACK_MAX_MS = NUDGE_AHEAD_MS - 1_000
# Rows placed up to this far ahead of the acknowledgement are checked for a firing first.
DONE_CHECK_AHEAD_MS = 1_000
# Rows read at one position beyond the jobs looked for (others placed at that millisecond).
SAME_MS_SLACK = 100
# Failed writes whose placement a retry reuses (Unsure): about 100 bytes each.
UNSURE_MAX = 100_000


class Unsure:
    """Placements of writes that failed but may have been applied (WriteTimeout,
    StoreUnavailable), or may be yet: a logged batch that reached the batchlog is
    replayed later, possibly after the retry. A retry of the same job (same due time,
    kind and payload) that still finds the lookup row where the failed write found it
    writes the noted rows again, an idempotent upsert newer than the batch; placing the
    job anew would leave the batch's bucket row armed beside the new one, to fire a
    second time. Once the lookup row is anywhere else, the failed write landed (or
    another writer moved the job): the entry is dropped, never reused, since its row may
    have been retired since. Oldest dropped past ``UNSURE_MAX``. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # job id -> (the lookup's row when the write was tried, or None; the new job)
        self._jobs: dict[str, tuple[tuple[int, int, int] | None, Job]] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    def note(self, pairs: Iterable[tuple[Job | None, Job]]) -> None:
        """Remember each failed ``(stored, new)``: ``stored`` the job as its lookup row
        stood before the write (None: no lookup row), ``new`` what was written."""
        with self._lock:
            for old, new in pairs:
                self._jobs.pop(new.job_id, None)  # re-inserted: newest last
                self._jobs[new.job_id] = (_row(old), new)
            while len(self._jobs) > UNSURE_MAX:
                del self._jobs[next(iter(self._jobs))]

    def reuse(self, jobs: Iterable[Job], stored: Mapping[str, Job]) -> dict[str, Job]:
        """The noted placements of ``jobs`` to write again: the same job, whose lookup row
        (in ``stored``) is still where the failed write found it. Entries whose lookup
        moved on are dropped."""
        out = {}
        with self._lock:
            for j in jobs:
                if (entry := self._jobs.get(j.job_id)) is None:
                    continue
                before, u = entry
                if _row(stored.get(j.job_id)) != before:
                    del self._jobs[j.job_id]  # landed, or moved by another writer
                elif (u.due_ms, u.kind, u.data) == (j.due_ms, j.kind, j.data) and _row(u) != before:
                    out[j.job_id] = u
        return out

    def forget(self, job_ids: Iterable[str]) -> None:
        with self._lock:
            for job_id in job_ids:
                self._jobs.pop(job_id, None)


def _row(job: Job | None) -> tuple[int, int, int] | None:
    return None if job is None else (job.bucket, job.shard, job.fire_ms)


class Placer(Protocol):
    """What repair needs of the producer."""

    meta: StoreMeta
    clock: Clock
    nudger: Nudger | None

    def replace_if_near(self, job: Job, now: int) -> Steps[Job]: ...

    unsure: Unsure


def at_risk(meta: StoreMeta, job: Job, ack_ms: int) -> bool:
    """Could a poller have read past this job's position before the write was visible?

    A poller reads at most ``late_margin - 2 * max_skew`` ahead of its clock, which is at
    most ``max_skew`` ahead of ours: positions up to ``ack + margin - max_skew`` may
    already be behind a cursor when the write became visible at ``ack``."""
    return job.fire_ms <= ack_ms + meta.late_margin_ms - meta.max_skew_ms


def repair_slow_writes(p: Placer, result: list[Job], written: set[str], started_ms: int) -> Steps[list[Job]]:
    """``result`` with the jobs of ``written`` that are at risk moved ahead of every
    cursor (see the module docstring). ``started_ms``: the placement time of the write.
    Store errors propagate: the caller retries the whole write, which is safe (a moved
    job is found by its lookup row and kept where it is unless at risk again)."""
    out = list(result)
    moved: set[str] = set()
    retired: list[Job] = []  # every old row, of every round
    pending, rounds = set(written), 0
    ack = p.clock.now_ms()  # when the write was acknowledged (then: the last move)
    for _ in range(ROUNDS):
        risky = [i for i, j in enumerate(out) if j.job_id in pending and at_risk(p.meta, j, ack)]
        if not risky:
            break
        # Only a row whose time has (nearly) come can have fired: reading the others
        # would only delay their move, and the retire that must reach the owner first.
        done = yield from _done_already([out[i] for i in risky
                                         if out[i].fire_ms <= ack + DONE_CHECK_AHEAD_MS])
        risky = [i for i in risky if out[i].job_id not in done]
        if not risky:
            break
        # Twice the last write's time: a move (a logged batch) is often slower than the
        # write it repairs, and one that outruns its room costs another round.
        slack = min(SLACK_MAX_MS, 2 * max(0, ack - started_ms))
        pairs = []
        for i in risky:
            new = yield from p.replace_if_near(out[i].evolve(fire_ms=0), ack + slack)
            pairs.append((out[i], new))
            out[i] = new
        retired += [old for old, _ in pairs]
        try:
            yield from call("move_many", pairs)
        except SchedulerError:
            # Some pairs may have been applied (or may be yet, from the batchlog): the
            # retry writes the same new rows, and the owners are told all the same (each
            # checks the store before dropping anything).
            p.unsure.note(pairs)
            yield from _retire(p, retired)
            raise
        acked = p.clock.now_ms()  # before the retire: its owner-map read is no write
        yield from _retire(p, [old for old, _ in pairs])
        started_ms, ack, rounds = ack, acked, rounds + 1
        pending = {new.job_id for _, new in pairs}
        moved |= pending
    if rounds > 1:
        # Once more for every round's old rows: a lost datagram would otherwise let one
        # row per round fire; now each would need two datagrams lost.
        yield from _retire(p, retired)
    if rounds:
        log.warning("moved %d jobs whose write was acknowledged late (%d round%s)",
                    len(moved), rounds, "" if rounds == 1 else "s",
                    extra={"action": "slow_write_repaired", "jobs": len(moved), "rounds": rounds})
    return out


def _retire(p: Placer, old: list[Job]) -> Steps[None]:
    if p.nudger is not None and old:
        yield from p.nudger.retire(old)


def _done_already(jobs: Sequence[Job]) -> Steps[set[str]]:
    """Ids of ``jobs`` whose bucket row the store shows fired or retired: a poller saw
    it in time (or someone cancelled or moved it), so it needs no move. One concurrent
    read per position (jobs placed in one call often share one millisecond)."""
    if not jobs:
        return set()
    at: dict[tuple[int, int, int], set[str]] = defaultdict(set)
    for j in jobs:
        at[(j.bucket, j.shard, j.fire_ms)].add(j.job_id)
    keys = list(at)
    parts = [(bucket, shard, (fire_ms - 1, ""), fire_ms) for bucket, shard, fire_ms in keys]
    limit = max(len(ids) for ids in at.values()) + SAME_MS_SLACK
    found: list[list[Job]] = yield from call("read_buckets", parts, limit)
    return {r.job_id for key, rows in zip(keys, found, strict=True) for r in rows
            if r.job_id in at[key] and r.fired_ms is not None}


def requeue(p: Placer, rows: Sequence[Job]) -> Steps[list[Job]]:
    """Move ``rows`` (pending rows a checkpoint has passed: a catch-up's finds) to fresh
    positions ahead of every cursor, keeping each job's due time, attempts and trace, and
    nudge their owners; the new rows. The jobs were due already, so they fire at once
    (within the late margin, or at once with the nudge).

    As slow-write repair does: the rows are read again just before the move, and one a
    producer cancelled or moved since (its row now retired) is left alone; a move
    acknowledged too late for the late-write rule is moved again; a move that failed is
    remembered, so calling again with the same rows writes the same placements (a
    logged batch may still land), and then calling again is safe. What remains is a
    cancel landing between that read and the move's write, as a cancel racing a fire.
    Store errors propagate."""
    done = yield from _done_already(rows)
    rows = [r for r in rows if r.job_id not in done]
    if not rows:
        return []
    started = p.clock.now_ms()
    again = p.unsure.reuse(rows, {r.job_id: r for r in rows})
    pairs = []
    for old in rows:
        new = again.get(old.job_id) or (yield from p.replace_if_near(old.evolve(fire_ms=0), started))
        pairs.append((old, new.evolve(attempts=old.attempts, last_error=old.last_error)))
    try:
        yield from call("move_many", pairs)
    except SchedulerError:
        p.unsure.note(pairs)
        raise
    p.unsure.forget(r.job_id for r in rows)
    out = yield from repair_slow_writes(p, [new for _, new in pairs], {r.job_id for r in rows}, started)
    if p.nudger is not None:
        yield from p.nudger.nudge(out)
    return out
