"""The poller's queue of read jobs, in two stages: the due queue (time order, the poller's
own rate bounds) and, once due, the fair queue (priorities, turns between kinds and keys,
and each kind's gate: its share of the fleet-wide rate and concurrency, and its pause).
Pure like its parts: the caller holds the core's lock and passes the clocks.

It offers the due queue's interface (``push``, ``pop_ready``, ``find``, the discards,
``drain``), so the reader, the nudges and the dispatcher see one queue wherever a job
waits. ``pop_ready`` is where a job is *admitted*: it counts against its kind's gate and
its key until ``finished`` is called for it (its outcome was recorded, or it was handed
back unstarted).

**Head-of-line blocking.** Jobs read wait here, and the reader stops reading at the
prefetch bound. A throttled or paused kind with a backlog would fill that bound and stop
every other kind read behind it. ``excess`` therefore names the jobs of a throttled kind
beyond what it can start in the next ``HORIZON_S`` (all of a paused kind's): the poller
places them later in the store (as a recurring occurrence that waits is), so their rows
complete, the checkpoint passes them, and the memory they held goes to other kinds. A
deferred job keeps its due time (lateness counts from it) and is never placed earlier
than it was.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterable, Iterator

from ..domain.fairqueue import FairQueue
from ..domain.flow import Limits
from ..domain.gates import Gates
from ..domain.model import Job
from ..domain.progress import Key
from .duequeue import DueQueue

# A throttled kind keeps this many seconds of its starts queued; beyond that (and
# KEEP_MIN), its newest waiting jobs are placed later.
HORIZON_S = 5.0
KEEP_MIN = 50
# What each throttled kind keeps at the least when many share the buffer's budget.
KEEP_FLOOR = 10
# A paused kind's due jobs are placed this far ahead, again and again while it stays
# paused: each held job costs one write per HOLD_S. On resume a poller takes back the
# rows it placed itself (``recall``); others (placed by a poller since gone) are back
# within HOLD_S. A bucket row cannot say it was held, so only remembered rows are taken
# back: a retry waiting for its backoff is never taken early.
HOLD_S = 30.0
HELD = "held: its kind is paused"
DEFERRED = "deferred: its kind is throttled"
PLACED_BY_FLOW = (HELD, DEFERRED)
# Rows placed later that a poller remembers per kind, to take back early when its kind
# can start them sooner (a raised rate, a resume); older ones come back at their time.
PLACED_MAX = 50_000
# At most this many jobs of one kind are placed later per dispatcher pass.
EXCESS_BATCH = 2000
# A throttled kind's excess is placed at most this far ahead, however slow its rate: a
# limit raised meanwhile then reaches the whole backlog within this time (each waiting
# job costs one write per DEFER_MAX_S while its kind stays throttled).
DEFER_MAX_S = 60.0


class FlowQueue:
    def __init__(self, due: DueQueue, monotonic: Callable[[], float], max_buffered: int = 20_000) -> None:
        self.due = due
        # A throttled kind keeps at most an eighth of the read buffer: the rest stays
        # free for the other kinds, whatever the kind's rate.
        self._keep_max = max(1, max_buffered // 8)
        # Rows, not jobs: two rows of one job may wait at once (a reschedule whose old
        # row is not retired yet), and each must complete on its own.
        self.fair: FairQueue[Job] = FairQueue(ident=_row)
        self.gates = Gates(monotonic)
        self.limits: dict[str, Limits] = {}
        # Paused kinds, replaced whole on a change: workers read it without the lock, to
        # hold a paused kind's jobs handed to them before the pause.
        self.paused: frozenset[str] = frozenset()
        self.settling: set[str] = set()  # kinds whose parts are about to rise (set_limits)
        self._held_next: dict[str, int] = {}  # per paused kind, the next free hold time (ms)
        # Until when (monotonic s) this poller's parts of the fleet-wide limits hold: set
        # by flow control after each publish; past it, limited kinds start nothing.
        self.parts_until = math.inf
        self._parts_lapsed = False  # parts_until passed, as of the current take
        self._take_now = 0.0  # the monotonic clock at the current take's start
        self._mono = monotonic
        # Admitted rows not finished yet, counted: a row can be admitted again while its
        # first run goes on (its shard lost and claimed again, the row read again).
        self._admitted: Counter[Key] = Counter()
        # Starts per kind over the last few seconds (the rate a kind limited only by
        # concurrency or key is seen to drain at), and holds of paused kinds in the
        # last HOLD_S (a held job is placed again once per HOLD_S while paused).
        self._starts: dict[str, deque[tuple[float, int]]] = {}
        self._holds: dict[str, deque[tuple[float, int]]] = {}
        self.throttled_kinds: set[str] = set()  # refused at least once since the last look
        # kind -> row -> job: rows this poller placed later (``placed``), oldest first.
        self._placed: dict[str, dict[Key, Job]] = {}

    @property
    def throttled(self) -> int:
        """The due queue's refusals at the poller's own rate bounds (``--max-rate``)."""
        return self.due.throttled

    @throttled.setter
    def throttled(self, value: int) -> None:
        self.due.throttled = value

    def __len__(self) -> int:
        return len(self.due) + len(self.fair)

    # --- limits --------------------------------------------------------------------

    def set_limits(self, limits: Limits, rate_share: float | None, slots: int | None,
                   settling: bool = False) -> None:
        """A kind's limits and this poller's parts of them, live. ``settling``: the parts
        are about to rise (they wait for the other pollers to see this one's), so the
        kind's waiting jobs are kept, not placed later, until they do."""
        if settling:
            self.settling.add(limits.kind)
        else:
            self.settling.discard(limits.kind)
        if limits.limited:
            self.limits[limits.kind] = limits
        else:
            self.limits.pop(limits.kind, None)
        if limits.paused != (limits.kind in self.paused):
            self.paused = self.paused ^ {limits.kind}
        self.gates.update(limits, rate_share, slots)
        self.fair.set_key_limit(limits)

    # --- the due queue's interface ----------------------------------------------------

    def push(self, job: Job, at_ms: int | None = None) -> None:
        """See ``DueQueue.push``; a job of the same id waiting in the fair stage is replaced."""
        self.fair.remove(_row(job))
        self.due.push(job, at_ms)

    def pop_ready(self, now_ms: int, max_n: int) -> list[Job]:
        """Up to ``max_n`` jobs to start now: every due job moves to the fair stage (within
        the poller's own rate bounds), then the fair queue picks, each through its kind's
        gate. Each job returned is admitted: call ``finished`` for it later."""
        self.fair.add_due(self.due.pop_ready(now_ms, len(self.due)), now_ms)
        # The clock read once per take, not per job: a take lasts microseconds, and the
        # parts' expiry moves once a second.
        now = self._take_now = self._mono()
        self._parts_lapsed = now > self.parts_until
        jobs = self.fair.take(max(0, max_n), now_ms, self._admit)
        if jobs:
            for kind, n in Counter(j.kind for j in jobs).items():
                if kind in self.limits:
                    _log(self._starts, kind, now, n)
        return jobs

    def _admit(self, job: Job) -> str | None:
        lim = self.limits.get(job.kind)
        if (lim is not None and self._parts_lapsed and not lim.paused
                and (lim.rate_per_s is not None or lim.concurrency is not None)):
            # Flow control could not publish for too long (its thread stuck in a store
            # call): the others may have taken this poller's parts.
            self.throttled_kinds.add(job.kind)
            return "rate" if lim.rate_per_s is not None else "concurrency"
        reason = self.gates.try_start(job.kind, self._take_now)
        if reason is None:
            self._admitted[_row(job)] += 1
        else:
            self.throttled_kinds.add(job.kind)
        return reason

    def finished(self, job: Job) -> None:
        """An admitted job ended (recorded, or handed back unstarted); others are ignored."""
        self.finished_many((job,))

    def finished_many(self, jobs: Iterable[Job]) -> None:
        """``finished`` for each job, the gates counted once per kind. Called twice per
        job of a limited kind (when its handler returns, and when its outcome is
        recorded), so it is one loop with no call per job unless the job has a key."""
        admitted = self._admitted
        ended: dict[str, int] = {}
        for job in jobs:
            row = (job.fire_ms, job.job_id)
            n = admitted.get(row, 0)
            if n > 0:
                if n > 1:
                    admitted[row] = n - 1
                else:
                    del admitted[row]
                ended[job.kind] = ended.get(job.kind, 0) + 1
                if job.key is not None:
                    self.fair.finished(job)
        for kind, n in ended.items():
            self.gates.finished(kind, n)

    def outlive(self, job: Job) -> bool:
        """An admitted job's handler outlives its outcome (abandoned past its timeout, still
        running): its slots (kind and key) stay taken until one more ``finished``, called
        when the handler returns. False (nothing held) for a job not admitted here."""
        row = _row(job)
        if self._admitted[row] <= 0:
            return False
        self._admitted[row] += 1
        self.gates.hold(job.kind)
        self.fair.hold(job)
        return True

    def next_wake_s(self, now_ms: int) -> float:
        wait = self.due.next_wake_s(now_ms)
        # Jobs refused by a gate wait for a token or a slot: look again soon.
        return min(wait, 0.02) if self.fair.waiting_kinds() else wait

    def find(self, keys: Collection[Key]) -> dict[Key, Job]:
        found = self.due.find(keys)
        for key in keys:
            if key not in found and (job := self.fair.get(key)) is not None:
                found[key] = job
        return found

    def discard(self, job_id: str, fire_ms: int) -> Job | None:
        dropped = self.discard_many({(fire_ms, job_id)})
        return dropped[0] if dropped else None

    def discard_many(self, keys: Collection[Key]) -> list[Job]:
        dropped = self.due.discard_many(keys)
        gone = {(j.fire_ms, j.job_id) for j in dropped}
        for key in keys:
            job = self.fair.get(key)
            if key not in gone and job is not None:
                self.fair.remove(key)
                dropped.append(job)
        return dropped

    def discard_shard(self, shard: int) -> list[Job]:
        dropped = self.due.discard_shard(shard)
        for job in self.fair.jobs():
            if job.shard == shard:
                self.fair.remove(_row(job))
                dropped.append(job)
        return dropped

    def _jobs(self) -> Iterator[Job]:
        yield from self.due._jobs()
        yield from self.fair.jobs()

    def drain(self) -> list[Job]:
        return self.due.drain() + self.fair.clear()

    # --- head-of-line blocking ----------------------------------------------------------

    def excess(self, now_ms: int) -> list[tuple[Job, int, str]]:
        """Jobs to place later, removed from the queue: ``(job, place_at_ms, why)``. A
        paused kind's waiting jobs all go (``HOLD_S`` ahead, oldest placed first); a
        throttled kind's beyond what it starts in ``HORIZON_S`` go to when it would start
        them at its rate. Kinds no gate refused keep everything."""
        out: list[tuple[Job, int, str]] = []
        now = self._mono()
        # Refused by the kind's gate, or a key at its per-key limit with jobs behind it
        # (those never reach the gate, and could fill the buffer as well).
        throttled, self.throttled_kinds = self.throttled_kinds, set()
        throttled |= self.fair.parked_kinds()
        waiting_kinds = self.fair.waiting_kinds()
        # The kept jobs of all throttled kinds together stay within a quarter of the
        # buffer (each kind keeps up to twice its cap before it is trimmed), however
        # many kinds are throttled at once.
        n_throttled = sum(1 for kind in waiting_kinds if kind in throttled and kind in self.limits)
        cap = max(KEEP_FLOOR, self._keep_max // max(1, n_throttled))
        for kind, waiting in waiting_kinds.items():
            limits = self.limits.get(kind)
            if limits is None:
                continue
            if limits.paused:
                # Oldest first, each pass after the last one's times: held rows come
                # back in due order however many passes a large backlog takes.
                jobs = self.fair.take_oldest(kind, min(waiting, EXCESS_BATCH))
                _log(self._holds, kind, now, len(jobs))
                at = max(now_ms + int(HOLD_S * 1000), self._held_next.get(kind, 0))
                out += [(job, at + i, HELD) for i, job in enumerate(jobs)]
                self._held_next[kind] = at + len(jobs)
                continue
            if kind not in throttled or kind in self.settling:
                continue
            rate = self._rate(kind, limits, now)
            keep = min(max(KEEP_MIN, int(rate * HORIZON_S)), cap)
            if waiting <= 2 * keep:
                continue
            jobs = sorted(self.fair.take_excess(kind, min(waiting - keep, EXCESS_BATCH)),
                          key=lambda j: (j.due_ms, j.job_id))
            start = 1000 * keep / rate
            latest = DEFER_MAX_S * 1000
            why = DEFERRED
            # After its row, never at or before it: a recalled row sits ahead of its due
            # time, and a steady backlog at a steady rate would place it where it is.
            out += [(job, max(job.fire_ms + 1, now_ms + int(min(latest, start + 1000 * i / rate))), why)
                    for i, job in enumerate(jobs)]
        self.due.give_back([job for job, _at, _why in out])
        return out

    def _rate(self, kind: str, limits: Limits, now: float) -> float:
        """The kind's start rate here: its rate share, else what it started lately (at
        least one a second)."""
        gate = self.gates.get(kind)
        if gate is not None and gate.rate_share is not None and gate.rate_share > 0:
            return gate.rate_share
        return max(1.0, _sum(self._starts, kind, now, HORIZON_S) / HORIZON_S)

    def placed(self, jobs: list[Job]) -> None:
        """The recorder wrote these rows: jobs this queue placed later (held or deferred)."""
        for job in jobs:
            rows = self._placed.setdefault(job.kind, {})
            rows[_row(job)] = job
            while len(rows) > PLACED_MAX:
                del rows[next(iter(rows))]

    def recall(self, now_ms: int) -> list[Job]:
        """Rows placed later that their kind can start sooner than placed: up to what keeps
        each such kind's queue at its ``keep`` (a kind not paused, whose waiting jobs fell
        below half of it). Forgotten here; the caller checks each row is still pending
        before queueing it. Rows whose time has passed are forgotten (they came back)."""
        out: list[Job] = []
        now = self._mono()
        waiting = self.fair.waiting_kinds()
        for kind in list(self._placed):
            rows = self._placed[kind]
            for key in [k for k in rows if k[0] <= now_ms]:
                del rows[key]
            if not rows:
                del self._placed[kind]
                continue
            limits = self.limits.get(kind)
            if limits is not None and limits.paused:
                continue
            if limits is None or (limits.rate_per_s is None and kind not in self.throttled_kinds):
                keep = self._keep_max  # nothing holds it back any more
            else:
                keep = min(max(KEEP_MIN, int(self._rate(kind, limits, now) * HORIZON_S)), self._keep_max)
            have = waiting.get(kind, 0)
            if have * 2 >= keep:
                continue
            for key in sorted(rows, key=lambda k: (rows[k].due_ms, k))[:keep - have]:  # oldest first
                out.append(rows.pop(key))
        return out

    def held(self, kind: str) -> int:
        """Jobs of ``kind`` this poller holds: those it placed ahead in the last ``HOLD_S``."""
        # One hold per held job per HOLD_S: a wider window would count a job twice.
        return _sum(self._holds, kind, self._mono(), HOLD_S)

    def held_kinds(self) -> list[str]:
        return list(self._holds)


def _log(log: dict[str, deque[tuple[float, int]]], kind: str, now: float, n: int) -> None:
    entries = log.setdefault(kind, deque())
    entries.append((now, n))
    while entries and entries[0][0] < now - 2 * HOLD_S:
        entries.popleft()


def _sum(log: dict[str, deque[tuple[float, int]]], kind: str, now: float, window: float) -> int:
    entries = log.get(kind)
    if not entries:
        return 0
    while entries and entries[0][0] < now - 2 * HOLD_S:
        entries.popleft()
    return sum(n for t, n in entries if t >= now - window)


def _row(job: Job) -> Key:
    """A queued row's identity, as the due queue and the shard's progress know it."""
    return (job.fire_ms, job.job_id)
