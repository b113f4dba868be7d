"""The fair queue of due jobs on one poller, pure; the per-kind gates it asks before each
start (rate and concurrency at this poller's share of the fleet-wide limits, pause) are
in ``gates.py``.

``FairQueue.take`` picks what starts next: never a job before its due time; higher
priority first; among the kinds of one priority, and among the keys of one kind, turns
in a ring (round-robin), so a key with 10,000 waiting jobs takes one turn as a key with
5 does; each key's jobs oldest first. A job refused by its kind's gate stays queued and
its kind sits out the rest of that take, without blocking any other kind.

Jobs without a key share one lane per kind and priority, which takes its turn as one key
does (and has no per-key limit).
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

from .flow import Limits, check_priority


class Queued(Protocol):
    """What the queue reads of a job (``domain.model.Job`` plus key and priority fits)."""

    @property
    def job_id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def key(self) -> str | None: ...
    @property
    def priority(self) -> int: ...
    @property
    def due_ms(self) -> int: ...


J = TypeVar("J", bound=Queued)
Lane = tuple[str, int, str | None]  # kind, priority, key
Entry = tuple[int, int, J]  # due_ms, seq (FIFO among equal due times), job


class FairQueue(Generic[J]):
    """Due jobs waiting to start on one poller. Cost per job: O(log n) to add and take,
    plus, per take, one look at each kind its gate refused. Lanes of a key at its per-key
    limit are set aside (parked) and come back when a job of that key finishes, so a take
    never scans them; a job removed is dropped lazily when its lane reaches it.

    Per-key counts are this poller's: they hold fleet-wide when every job of a key is on
    one poller (jobs sharded by their key)."""

    def __init__(self, ident: Callable[[J], Hashable] = lambda job: job.job_id) -> None:
        # What tells two queued jobs apart: the job id by default; the poller's queue
        # uses the row's (fire_ms, job_id), since two rows of one job can be queued
        # at once (a reschedule whose old row is not retired yet).
        self._id = ident
        self._seq = 0
        self._live: dict[Hashable, tuple[int, J]] = {}  # ident -> (seq, job) of queued jobs
        self._future: list[Entry[J]] = []  # not due yet, by due time
        self._ready_ids: set[Hashable] = set()
        self._ready: Counter[str] = Counter()  # kind -> due jobs waiting
        self._lanes: dict[Lane, list[Entry[J]]] = {}
        # priority -> ring of kinds with ringed lanes; (priority, kind) -> ring of keys
        self._kinds: dict[int, deque[str]] = {p: deque() for p in range(10)}
        self._keys: dict[tuple[int, str], deque[str | None]] = {}
        self._ringed: set[Lane] = set()
        self._parked: dict[tuple[str, str], set[int]] = {}  # (kind, key) at its limit
        self._running: Counter[tuple[str, str]] = Counter()
        self._key_limit: dict[str, int] = {}
        self.throttled: Counter[tuple[str, str]] = Counter()  # (kind, reason) -> refusals

    def __len__(self) -> int:
        return len(self._live)

    def waiting(self, kind: str) -> int:
        """Jobs of ``kind`` due and waiting (as of the last take): its held jobs when paused."""
        return self._ready[kind]

    def running(self, kind: str, key: str) -> int:
        return self._running[(kind, key)]

    def add(self, job: J) -> bool:
        """Queue a job; False if one with its id is queued already (a re-read row).
        Raises InvalidInput for a priority outside 0-9, queueing nothing."""
        return self._add(job, None)

    def add_due(self, jobs: list[J], now_ms: int) -> None:
        """``add`` each job and promote what is due at ``now_ms`` (as ``take`` at that time
        does first), the caller having found the jobs due: they go straight to their
        lanes in due order (stable), the order promotion would give them, without the
        heap of jobs not due yet. When jobs added earlier have come due meanwhile, the
        batch goes through that heap (their order against the batch is promotion's).
        Raises InvalidInput for a bad priority, having queued the jobs before it."""
        if self._future and self._future[0][0] <= now_ms:
            for job in jobs:
                self._add(job, None)
            self._promote(now_ms)
            return
        for job in sorted(jobs, key=_due):
            self._add(job, now_ms)

    def _add(self, job: J, now_ms: int | None) -> bool:
        check_priority(job.priority)
        ident = self._id(job)
        if ident in self._live:
            return False
        self._seq += 1
        self._live[ident] = (self._seq, job)
        entry = (job.due_ms, self._seq, job)
        if now_ms is None or job.due_ms > now_ms:
            heapq.heappush(self._future, entry)
        else:
            self._ready_entry(ident, entry)
        return True

    def remove(self, ident: Hashable) -> bool:
        """Forget a queued job (cancelled, or its shard lost); False if it was not queued."""
        queued = self._live.pop(ident, None)
        if queued is None:
            return False
        if ident in self._ready_ids:
            self._ready_ids.discard(ident)
            self._ready[queued[1].kind] -= 1
        return True

    def set_key_limit(self, limits: Limits) -> None:
        """The kind's per-key concurrency changed (None: no limit); live."""
        kind, limit = limits.kind, limits.per_key_concurrency
        if limit is None:
            self._key_limit.pop(kind, None)
        else:
            self._key_limit[kind] = limit
        for kind_key in [kk for kk in self._parked if kk[0] == kind]:
            self._unpark(kind_key)

    def hold(self, job: J) -> None:
        """A job taken earlier counts once more against its key (until one more
        ``finished``): a handler that outlives its recorded outcome."""
        if job.key is not None:
            self._running[(job.kind, job.key)] += 1

    def finished(self, job: J) -> None:
        """A job taken earlier ended: its key may run one more."""
        if job.key is None:
            return
        kind_key = (job.kind, job.key)
        self._running[kind_key] -= 1
        if self._running[kind_key] <= 0:
            del self._running[kind_key]
        self._unpark(kind_key)

    def take(self, n: int, now_ms: int, admit: Callable[[J], str | None]) -> list[J]:
        """Up to ``n`` jobs due at ``now_ms`` to start now, in order. ``admit(job)`` is the
        kind's gate: None starts the job, a reason (counted in ``throttled``) leaves it
        queued and skips its kind for the rest of this take. If ``admit`` raises, the job
        stays queued and the error propagates. Every job returned counts against its key
        until it is passed to ``finished`` (started or not)."""
        self._promote(now_ms)
        out: list[J] = []
        refused: set[str] = set()
        while len(out) < n:
            job = self._next(refused, admit)
            if job is None:
                break
            out.append(job)
            if job.key is None and len(out) < n:
                self._run(job, out, n, refused, admit)
        return out

    def _run(self, first: J, out: list[J], n: int, refused: set[str],
             admit: Callable[[J], str | None]) -> None:
        """After ``first`` (taken from its kind's keyless lane), more from that lane while it
        is the only lane of the only kind at its priority: each turn would go to it again,
        so the order is ``_next``'s, without a ring's turn per job. Every higher priority
        is empty or refused for this take (``_next`` looks there first)."""
        kind, prio = first.kind, first.priority
        if len(self._kinds[prio]) != 1 or len(self._keys.get((prio, kind), ())) != 1:
            return
        heap = self._lanes.get((kind, prio, None))
        live, ready_ids, ident_of = self._live, self._ready_ids, self._id
        taken = 0
        try:  # an admit that raises: the jobs taken so far are counted out
            while heap and len(out) < n:
                seq, job = heap[0][1], heap[0][2]
                ident = ident_of(job)
                if live.get(ident, (None,))[0] != seq:
                    heapq.heappop(heap)  # removed while queued
                    continue
                reason = admit(job)
                if reason is not None:
                    refused.add(kind)
                    self.throttled[(kind, reason)] += 1
                    break
                heapq.heappop(heap)
                del live[ident]
                ready_ids.discard(ident)
                out.append(job)
                taken += 1
        finally:
            self._ready[kind] -= taken
        # An emptied lane is dropped from its ring by the next ``_next``, as when a
        # turn finds it empty.

    def _promote(self, now_ms: int) -> None:
        while self._future and self._future[0][0] <= now_ms:
            entry = heapq.heappop(self._future)
            ident = self._id(entry[2])
            if self._live.get(ident, (None,))[0] != entry[1]:
                continue  # removed meanwhile
            self._ready_entry(ident, entry)

    def _ready_entry(self, ident: Hashable, entry: Entry[J]) -> None:
        """A live job that is due joins its lane (and the lane its ring)."""
        job = entry[2]
        self._ready_ids.add(ident)
        self._ready[job.kind] += 1
        lane = (job.kind, job.priority, job.key)
        heapq.heappush(self._lanes.setdefault(lane, []), entry)
        if lane in self._ringed:
            return
        parked = None if job.key is None else self._parked.get((job.kind, job.key))
        if parked is not None:
            parked.add(job.priority)
        else:
            self._ring(lane)

    def _ring(self, lane: Lane) -> None:
        kind, prio, key = lane
        keys = self._keys.get((prio, kind))
        if keys is None:
            keys = self._keys[(prio, kind)] = deque()
            self._kinds[prio].append(kind)
        keys.append(key)
        self._ringed.add(lane)

    def _unpark(self, kind_key: tuple[str, str]) -> None:
        kind, key = kind_key
        limit = self._key_limit.get(kind)
        if kind_key not in self._parked or (limit is not None and self._running[kind_key] >= limit):
            return
        for prio in sorted(self._parked.pop(kind_key), reverse=True):
            if (kind, prio, key) in self._lanes:
                self._ring((kind, prio, key))

    def _next(self, refused: set[str], admit: Callable[[J], str | None]) -> J | None:
        for prio in range(9, -1, -1):
            kinds = self._kinds[prio]
            spins = len(kinds)
            while spins > 0 and kinds:
                kind = kinds[0]
                if kind in refused:
                    kinds.rotate(-1)
                    spins -= 1
                    continue
                job = self._from_kind(prio, kind, refused, admit)
                if (prio, kind) not in self._keys:
                    kinds.popleft()  # no lane of this kind and priority is ringed any more
                    spins -= 1
                elif job is None:
                    kinds.rotate(-1)  # refused
                    spins -= 1
                else:
                    kinds.rotate(-1)  # its turn is over
                if job is not None:
                    return job
        return None

    def _from_kind(self, prio: int, kind: str, refused: set[str],
                   admit: Callable[[J], str | None]) -> J | None:
        keys = self._keys[(prio, kind)]
        limit = self._key_limit.get(kind)
        try:
            while keys:
                key = keys[0]
                lane = (kind, prio, key)
                heap = self._lanes[lane]
                while heap and self._live.get(self._id(heap[0][2]), (None,))[0] != heap[0][1]:
                    heapq.heappop(heap)  # removed while queued
                if not heap:
                    keys.popleft()
                    self._ringed.discard(lane)
                    del self._lanes[lane]
                    continue
                if key is not None and limit is not None and self._running[(kind, key)] >= limit:
                    keys.popleft()
                    self._ringed.discard(lane)
                    self._parked.setdefault((kind, key), set()).add(prio)
                    self.throttled[(kind, "key")] += 1
                    continue
                job = heap[0][2]
                reason = admit(job)
                if reason is not None:
                    refused.add(kind)
                    self.throttled[(kind, reason)] += 1
                    return None
                heapq.heappop(heap)
                ident = self._id(job)
                del self._live[ident]
                self._ready_ids.discard(ident)
                self._ready[kind] -= 1
                if key is not None:
                    self._running[(kind, key)] += 1
                keys.rotate(-1)  # this key's turn is over
                return job
            return None
        finally:
            if not keys:
                del self._keys[(prio, kind)]

    # --- what the poller's queue needs besides taking --------------------------------

    def take_oldest(self, kind: str, n: int) -> list[J]:
        """Remove and return ``kind``'s ``n`` oldest due waiting jobs (by due time, then
        id), whatever their priority or key: a paused kind's are held in due order."""
        live = [job for (k, _p, _key), heap in self._lanes.items() if k == kind
                for e in heap if self._live.get(self._id(job := e[2]), (None,))[0] == e[1]]
        out = heapq.nsmallest(n, live, key=lambda job: (job.due_ms, job.job_id))
        for job in out:
            self.remove(self._id(job))
        return out

    def get(self, ident: Hashable) -> J | None:
        """The queued job with this ident, if any."""
        queued = self._live.get(ident)
        return None if queued is None else queued[1]

    def jobs(self) -> list[J]:
        """Every queued job, due or not."""
        return [job for _, job in self._live.values()]

    def clear(self) -> list[J]:
        """Remove and return every queued job (shutdown)."""
        out = self.jobs()
        for job in out:
            self.remove(self._id(job))
        return out

    def parked_kinds(self) -> set[str]:
        """Kinds with a key at its per-key limit and jobs waiting behind it."""
        return {kind for kind, _key in self._parked}

    def waiting_kinds(self) -> dict[str, int]:
        """kind -> due jobs waiting, for the kinds with any (as of the last take)."""
        return {kind: n for kind, n in self._ready.items() if n > 0}

    def take_excess(self, kind: str, n: int) -> list[J]:
        """Remove and return up to ``n`` of ``kind``'s due waiting jobs, to be placed later:
        lowest priority first, and within a priority from the keys with the most waiting
        (the water level falls on the largest keys first, so a small key keeps its jobs),
        each key's newest first. What stays is what would start first."""
        out: list[J] = []
        for prio in range(10):
            if len(out) >= n:
                break
            lanes: dict[str | None, list[Entry[J]]] = {}
            for (k, p, key), heap in self._lanes.items():
                if k == kind and p == prio:
                    live = [e for e in heap if self._live.get(self._id(e[2]), (None,))[0] == e[1]]
                    if live:
                        lanes[key] = sorted(live)
            # Ties by the key's name, then by a unique index: never by the keys themselves
            # (the keyless lane's None against a key spelled "None" does not compare).
            names = list(lanes)
            sizes = [(-len(lanes[key]), "" if key is None else key, i) for i, key in enumerate(names)]
            heapq.heapify(sizes)
            while sizes and len(out) < n:
                size, name, i = heapq.heappop(sizes)
                entries = lanes[names[i]]
                out.append(entries.pop()[2])  # its newest
                if entries:
                    heapq.heappush(sizes, (size + 1, name, i))
        for job in out:
            self.remove(self._id(job))
        return out


def _due(job: Queued) -> int:
    return job.due_ms
