"""The due queue: prefetched jobs wait here until due, then leave oldest first, to be
dispatched to handlers, within the dispatch-rate bounds. Pure: no threads, no I/O, clocks passed in.

A job leaves only when ``now_ms >= job.fire_ms`` (or the earlier time it was pushed
with, never before its due time) by the poller's wall clock, so it never fires early by
that clock. A shard over its own rate parks its due jobs in a per-shard
queue, so one busy shard cannot hold back the others.

Every queued job is indexed by its key ``(fire_ms, job_id)``, so ``find`` and the
discards cost a lookup per key, not a pass over the queue (nudge re-checks call them
while the queue holds up to ``max_buffered`` rows). A discarded job's heap entry stays
in the heap, stale, until it reaches the top or the heap is compacted.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from ..domain.model import Job
from ..domain.progress import Key
from ..domain.ratelimit import TokenBucket

# Stale heap entries tolerated beyond the live ones before the heap is rebuilt.
COMPACT_SLACK = 64


@dataclass(slots=True)
class _Queued:
    seq: int  # which heap entry is this job's: an older entry of the same key is stale
    job: Job
    parked: bool = False  # in its shard's parked queue, no longer in the heap


class DueQueue:
    def __init__(self, poller_rate: float | None = None, shard_rate: float | None = None,
                 monotonic: Callable[[], float] | None = None) -> None:
        # (leave at ms, job_id, seq, job): ids break ties, and the sequence number keeps
        # two entries of one job (one stale) from being compared by their jobs.
        self._heap: list[tuple[int, str, int, Job]] = []
        # Every queued job, in the heap or parked, by key: the only record of which
        # heap entries are live.
        self._index: dict[Key, _Queued] = {}
        self._in_heap = 0  # live heap entries (the rest of the heap is stale)
        self._seq = 0
        self._poller = TokenBucket(poller_rate, monotonic=monotonic)
        self._shard_rate = shard_rate
        self._mono = monotonic
        self._shard_buckets: dict[int, TokenBucket] = {}
        # Due jobs of shards over their rate, in dispatch order.
        self._parked: dict[int, deque[Job]] = {}
        self.throttled = 0  # how many times a due job had to wait for a token

    def __len__(self) -> int:
        return len(self._index)

    def push(self, job: Job, at_ms: int | None = None) -> None:
        """Queue ``job`` to leave at its fire time, or at ``at_ms`` (a due-now job taken
        ahead of the read cursor leaves at its due time: never before it is due). A
        poller never queues a key twice; if it did, the later push replaces the earlier
        one (the job leaves once)."""
        key = (job.fire_ms, job.job_id)
        if key in self._index:
            self._remove([key])
        self._seq += 1
        self._index[key] = _Queued(self._seq, job)
        self._in_heap += 1
        heapq.heappush(self._heap, (job.fire_ms if at_ms is None else at_ms, job.job_id, self._seq, job))

    def _shard_bucket(self, shard: int) -> TokenBucket:
        tb = self._shard_buckets.get(shard)
        if tb is None:
            tb = self._shard_buckets[shard] = TokenBucket(self._shard_rate, monotonic=self._mono)
        return tb

    def _live(self, entry: tuple[int, str, int, Job]) -> bool:
        q = self._index.get((entry[3].fire_ms, entry[1]))
        return q is not None and q.seq == entry[2] and not q.parked

    def _top(self) -> tuple[int, str, int, Job] | None:
        """The heap's first live entry, stale ones above it dropped; None when empty."""
        heap = self._heap
        while heap and not self._live(heap[0]):
            heapq.heappop(heap)
        return heap[0] if heap else None

    def pop_ready(self, now_ms: int, max_n: int) -> list[Job]:
        """Up to ``max_n`` due jobs that the rate bounds allow, oldest first."""
        out: list[Job] = []
        # Parked jobs are older than anything still in the heap: they go first.
        for shard in list(self._parked):
            queue = self._parked[shard]
            tb = self._shard_bucket(shard)
            while queue and len(out) < max_n and tb.try_take():
                if not self._poller.try_take():
                    tb.give_back()
                    self.throttled += 1
                    return out
                job = queue.popleft()
                del self._index[(job.fire_ms, job.job_id)]
                out.append(job)
            if not queue:
                del self._parked[shard]
        while len(out) < max_n and (top := self._top()) is not None and top[0] <= now_ms:
            job = top[3]
            key = (job.fire_ms, job.job_id)
            if self._shard_rate is not None and (job.shard in self._parked
                                                 or not self._shard_bucket(job.shard).try_take()):
                heapq.heappop(self._heap)
                self._in_heap -= 1
                self._index[key].parked = True
                self._parked.setdefault(job.shard, deque()).append(job)
                self.throttled += 1
                continue
            if not self._poller.try_take():
                if self._shard_rate is not None:
                    self._shard_bucket(job.shard).give_back()
                self.throttled += 1
                break
            heapq.heappop(self._heap)
            self._in_heap -= 1
            del self._index[key]
            out.append(job)
        return out

    def give_back(self, jobs: list[Job]) -> None:
        """Return the rate tokens ``jobs`` took from ``pop_ready`` (they were not started
        after all: flow control placed them later), so they do not count against
        ``--max-rate`` and ``--max-shard-rate`` twice, and other kinds can use them."""
        if not jobs:
            return
        self._poller.give_back(len(jobs))
        if self._shard_rate is not None:
            for shard, n in Counter(job.shard for job in jobs).items():
                self._shard_bucket(shard).give_back(n)

    def next_wake_s(self, now_ms: int) -> float:
        """How long the dispatch thread may sleep before something could be ready."""
        waits = []
        if self._parked:
            waits.append(min(self._shard_bucket(s).wait_s() for s in self._parked))
            waits.append(self._poller.wait_s())
        top = self._top()
        if top is not None:
            due_in = max(0.0, (top[0] - now_ms) / 1000)
            waits.append(max(due_in, self._poller.wait_s()))
        return min(waits) if waits else 3600.0

    def discard_shard(self, shard: int) -> list[Job]:
        """Remove and return every job of ``shard`` (its ownership was lost). One pass
        over the queue: a rare operation."""
        return self._remove([key for key, q in self._index.items() if q.job.shard == shard])

    def find(self, keys: Collection[Key]) -> dict[Key, Job]:
        """The queued jobs (in the heap or parked) whose ``(fire_ms, job_id)`` is one of
        ``keys``: a lookup per key."""
        index = self._index
        return {key: q.job for key in keys if (q := index.get(key)) is not None}

    def discard(self, job_id: str, fire_ms: int) -> Job | None:
        """Remove the queued job with this key, if any, and return it (None when it is
        not queued: dispatched already, or never queued)."""
        dropped = self.discard_many({(fire_ms, job_id)})
        return dropped[0] if dropped else None

    def discard_many(self, keys: Collection[Key]) -> list[Job]:
        """Remove and return the queued jobs whose ``(fire_ms, job_id)`` is one of ``keys``,
        wherever they wait: in the heap (matched on the job, not on the heap's time: a job
        taken early waits under its due time) or parked behind its shard's rate. A lookup
        per key, plus a pass over the parked queue of each shard a parked one was in."""
        return self._remove([key for key in dict.fromkeys(keys) if key in self._index])

    def _remove(self, keys: list[Key]) -> list[Job]:
        """Remove the queued jobs of ``keys`` (each queued, no repeats) and return them."""
        dropped: list[Job] = []
        parked: dict[int, set[Key]] = {}
        for key in keys:
            q = self._index.pop(key)
            dropped.append(q.job)
            if q.parked:
                parked.setdefault(q.job.shard, set()).add(key)
            else:
                self._in_heap -= 1  # its heap entry is now stale
        for shard, gone in parked.items():
            kept = deque(j for j in self._parked[shard] if (j.fire_ms, j.job_id) not in gone)
            if kept:
                self._parked[shard] = kept
            else:
                del self._parked[shard]
        if len(self._heap) - self._in_heap > max(COMPACT_SLACK, self._in_heap):
            self._heap = [e for e in self._heap if self._live(e)]
            heapq.heapify(self._heap)
        return dropped

    def _jobs(self) -> Iterator[Job]:
        """Every queued job (tests read the queue through this)."""
        return (q.job for q in self._index.values())

    def drain(self) -> list[Job]:
        """Remove and return everything (shutdown)."""
        out = [e[3] for e in self._heap if self._live(e)]
        for q in self._parked.values():
            out.extend(q)
        self._heap, self._parked, self._index, self._in_heap = [], {}, {}, 0
        return out
