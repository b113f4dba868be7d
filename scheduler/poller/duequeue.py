"""The due queue: prefetched jobs wait here until due, then leave oldest first, to be
dispatched to handlers, within the dispatch-rate bounds. Pure: no threads, no I/O, clocks passed in.

A job leaves only when ``now_ms >= job.fire_ms`` (or the earlier time it was pushed
with, never before its due time) by the poller's wall clock, so it never fires early by
that clock. A shard over its own rate parks its due jobs in a per-shard
queue, so one busy shard cannot hold back the others.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Collection, Iterator

from ..domain.model import Job
from ..domain.progress import Key
from ..domain.ratelimit import TokenBucket


class DueQueue:
    def __init__(self, poller_rate: float | None = None, shard_rate: float | None = None,
                 monotonic: Callable[[], float] | None = None) -> None:
        # (fire_ms, job_id, job): job ids break ties, and a poller never holds one
        # (fire_ms, job_id) twice.
        self._heap: list[tuple[int, str, Job]] = []
        self._poller = TokenBucket(poller_rate, monotonic=monotonic)
        self._shard_rate = shard_rate
        self._mono = monotonic
        self._shard_buckets: dict[int, TokenBucket] = {}
        # Due jobs of shards over their rate, in dispatch order.
        self._parked: dict[int, deque[Job]] = {}
        self.throttled = 0  # how many times a due job had to wait for a token

    def __len__(self) -> int:
        return len(self._heap) + sum(len(q) for q in self._parked.values())

    def push(self, job: Job, at_ms: int | None = None) -> None:
        """Queue ``job`` to leave at its fire time, or at ``at_ms`` (a due-now job taken
        ahead of the read cursor leaves at its due time: never before it is due)."""
        heapq.heappush(self._heap, (job.fire_ms if at_ms is None else at_ms, job.job_id, job))

    def _shard_bucket(self, shard: int) -> TokenBucket:
        tb = self._shard_buckets.get(shard)
        if tb is None:
            tb = self._shard_buckets[shard] = TokenBucket(self._shard_rate, monotonic=self._mono)
        return tb

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
                out.append(queue.popleft())
            if not queue:
                del self._parked[shard]
        while self._heap and len(out) < max_n and self._heap[0][0] <= now_ms:
            job = self._heap[0][2]
            if self._shard_rate is not None and (job.shard in self._parked
                                                 or not self._shard_bucket(job.shard).try_take()):
                heapq.heappop(self._heap)
                self._parked.setdefault(job.shard, deque()).append(job)
                self.throttled += 1
                continue
            if not self._poller.try_take():
                if self._shard_rate is not None:
                    self._shard_bucket(job.shard).give_back()
                self.throttled += 1
                break
            heapq.heappop(self._heap)
            out.append(job)
        return out

    def next_wake_s(self, now_ms: int) -> float:
        """How long the dispatch thread may sleep before something could be ready."""
        waits = []
        if self._parked:
            waits.append(min(self._shard_bucket(s).wait_s() for s in self._parked))
            waits.append(self._poller.wait_s())
        if self._heap:
            due_in = max(0.0, (self._heap[0][0] - now_ms) / 1000)
            waits.append(max(due_in, self._poller.wait_s()))
        return min(waits) if waits else 3600.0

    def discard_shard(self, shard: int) -> list[Job]:
        """Remove and return every job of ``shard`` (its ownership was lost)."""
        dropped = [e[2] for e in self._heap if e[2].shard == shard]
        if dropped:
            self._heap = [e for e in self._heap if e[2].shard != shard]
            heapq.heapify(self._heap)
        dropped.extend(self._parked.pop(shard, ()))
        return dropped

    def find(self, keys: Collection[Key]) -> dict[Key, Job]:
        """The queued jobs (in the heap or parked) whose ``(fire_ms, job_id)`` is one of
        ``keys``. One pass over the queue: for rare checks, not for every job."""
        if not keys:
            return {}
        found = {}
        for job in self._jobs():
            key = (job.fire_ms, job.job_id)
            if key in keys:
                found[key] = job
        return found

    def discard(self, job_id: str, fire_ms: int) -> Job | None:
        """Remove the queued job with this key, if any, and return it (None when it is
        not queued: dispatched already, or never queued). O(n): a rare operation."""
        dropped = self.discard_many({(fire_ms, job_id)})
        return dropped[0] if dropped else None

    def discard_many(self, keys: Collection[Key]) -> list[Job]:
        """Remove and return the queued jobs whose ``(fire_ms, job_id)`` is one of ``keys``,
        wherever they wait: in the heap (matched on the job, not on the heap's time: a job
        taken early waits under its due time) or parked behind its shard's rate. One pass
        over the queue whatever the number of keys."""
        if not keys:
            return []
        dropped = [e[2] for e in self._heap if (e[2].fire_ms, e[2].job_id) in keys]
        if dropped:
            self._heap = [e for e in self._heap if (e[2].fire_ms, e[2].job_id) not in keys]
            heapq.heapify(self._heap)
        for shard in list(self._parked):
            queue = self._parked[shard]
            if any((j.fire_ms, j.job_id) in keys for j in queue):
                dropped.extend(j for j in queue if (j.fire_ms, j.job_id) in keys)
                kept = deque(j for j in queue if (j.fire_ms, j.job_id) not in keys)
                if kept:
                    self._parked[shard] = kept
                else:
                    del self._parked[shard]
        return dropped

    def _jobs(self) -> Iterator[Job]:
        for e in self._heap:
            yield e[2]
        for q in self._parked.values():
            yield from q

    def drain(self) -> list[Job]:
        """Remove and return everything (shutdown)."""
        out = [e[2] for e in self._heap]
        for q in self._parked.values():
            out.extend(q)
        self._heap, self._parked = [], {}
        return out
