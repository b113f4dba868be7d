"""Rows read back by position: what the nudge listener, flow control's recall and the
recorder's flow placements share. A set of ``(fire_ms, job_id)`` keys of one shard and
bucket is one ranged read (``span``), and a row read back is taken ahead of the cursor
only when the store shows it pending and due (``take_early``)."""

from __future__ import annotations

from collections.abc import Iterable

from ..domain.model import Job
from ..domain.progress import Key
from ..store.base import PartRange
from .shared import Core, OwnedShard


def span(shard: int, bucket: int, keys: Iterable[Key]) -> PartRange:
    """The range of ``read_buckets`` holding every one of ``keys`` (positions of one shard
    and bucket): from just before the first one's millisecond (job ids are never empty,
    so every row at it sorts after ``(fire_ms, "")``) to the last one's."""
    fires = [k[0] for k in keys]
    return bucket, shard, (min(fires), ""), max(fires)


def by_partition(jobs: Iterable[Job]) -> dict[tuple[int, int], dict[Key, Job]]:
    """``jobs`` by ``(shard, bucket)``, each keyed by its position."""
    groups: dict[tuple[int, int], dict[Key, Job]] = {}
    for job in jobs:
        groups.setdefault((job.shard, job.bucket), {})[(job.fire_ms, job.job_id)] = job
    return groups


def take_early(core: Core, st: OwnedShard, bucket: int, keys: Iterable[Key] | dict[Key, Job],
               rows: list[Job], due_by_ms: int) -> int:
    """Queue, at its due time, each of ``rows`` that ``keys`` names and the store shows
    pending, not an occurrence's placeholder, and due by ``due_by_ms``, marking it taken
    early on ``st`` so the cursor does not queue it again. Call under ``core.cond``, with
    ``st`` a shard still read. Returns how many were queued."""
    wanted = keys if isinstance(keys, dict | set | frozenset) else set(keys)
    n = 0
    push = core.due.push
    for row in rows:
        key = (row.fire_ms, row.job_id)
        if (key in wanted and row.fired_ms is None and row.kind and row.due_ms <= due_by_ms
                and st.progress.take_early(bucket, key)):
            push(row, at_ms=row.due_ms)
            n += 1
    return n
