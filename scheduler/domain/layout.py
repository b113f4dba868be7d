"""Shard layouts: which shard count S is in force for which bucket. Pure, no I/O.

A layout says "from bucket B on, S = n". Layouts are append-only and a new one takes
effect only at a cutover far enough ahead that every producer has refreshed its cached
copy (see :func:`earliest_cutover_ms`).

Writers use the layout in force for the job's bucket when they write. A job written
for a far-future bucket before a resize keeps the shard it was written with, so a
reader must also read the shards of an older layout for every bucket that layout's
writers reached. Producers record that reach as a *mark* per layout (the exclusive end,
rounded up to ``MARK_SPAN_S``, of the furthest bucket they wrote under it) before they
write the job; :meth:`Layouts.read_count` then covers both.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ..errors import InvalidInput, ResizeRefused

# Temporal clusters run up to 16,384 shards; here the published plan for 16,384 shards is
# 28 KB and computing it takes under 10 ms (bench.fleetsim). What grows with S beyond the
# pollers: the checkpoints table (S rows, read by views and the exporter) and, for
# ``status`` and the exporter's ownership figures, one ZooKeeper read per shard lock.
MAX_SHARD_COUNT = 16384
# Marks are coarse so a producer writes one only when it reaches a new hour.
MARK_SPAN_S = 3600


@dataclass(frozen=True)
class Layout:
    from_bucket: int
    shard_count: int
    created_ms: int = 0
    # Exclusive end of the buckets written under this layout, 0 when none.
    mark_end: int = 0


def mark_end_for(bucket: int) -> int:
    """The mark that covers ``bucket``: the next ``MARK_SPAN_S`` boundary after it."""
    return (bucket // MARK_SPAN_S + 1) * MARK_SPAN_S


def check_shard_count(count: int) -> None:
    if not 1 <= count <= MAX_SHARD_COUNT:
        raise InvalidInput(f"shard count must be between 1 and {MAX_SHARD_COUNT}, got {count}")


class Layouts:
    """An immutable, sorted view of a keyspace's layouts."""

    def __init__(self, layouts: Iterable[Layout]) -> None:
        self._items = sorted(layouts, key=lambda lay: lay.from_bucket)
        if not self._items:
            raise ValueError("a keyspace always has at least one layout")

    def __iter__(self) -> Iterator[Layout]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def items(self) -> list[Layout]:
        return list(self._items)

    def all_shards(self) -> int:
        """How many shards any layout has: the shard numbers a fleet may have to drain."""
        return max(lay.shard_count for lay in self._items)

    @property
    def latest(self) -> Layout:
        return self._items[-1]

    def write_layout(self, bucket: int) -> Layout:
        """The layout a producer uses for ``bucket``: the last one starting at or before it.

        A bucket before the first layout uses the first one (it can only hold late
        writes that were moved forward, so this never happens for new writes).
        """
        chosen = self._items[0]
        for lay in self._items:
            if lay.from_bucket <= bucket:
                chosen = lay
            else:
                break
        return chosen

    def read_count(self, bucket: int) -> int:
        """How many shards (0..n-1) a reader must read for ``bucket``.

        The write layout's count, widened by any older layout whose writers reached
        this bucket before a newer layout took over.
        """
        count = self.write_layout(bucket).shard_count
        for lay in self._items:
            if lay.from_bucket > bucket:
                break
            if bucket < lay.mark_end:
                count = max(count, lay.shard_count)
        return count


def parse_shard_spec(spec: str) -> list[int]:
    """``"0-15"``, ``"0,2,5-7"`` -> sorted shard numbers; an error names the bad part."""
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise InvalidInput(f"shard spec {spec!r}: {part!r} is not N or N-M") from None
        if first < 0 or last < first or last >= MAX_SHARD_COUNT:
            raise InvalidInput(f"shard spec {spec!r}: {part!r} is not a range within 0-{MAX_SHARD_COUNT - 1}")
        out.update(range(first, last + 1))
    return sorted(out)


def earliest_cutover_ms(now_ms: int, cache_ttl_ms: int, late_margin_ms: int,
                        max_skew_ms: int) -> int:
    """The earliest wall time a new layout may take effect.

    A producer refreshes its cached layouts at least every ``cache_ttl_ms`` and refuses
    to write with an older copy, so after that long no producer writes with the old
    layout into buckets the new one covers, except through its mark. The late-write
    margin and the skew bound cover a write that was already in flight.
    """
    return now_ms + cache_ttl_ms + late_margin_ms + max_skew_ms


def check_resize(layouts: Layouts, count: int, cutover_ms: int, now_ms: int, width_s: int,
                 cache_ttl_ms: int, late_margin_ms: int, max_skew_ms: int) -> Layout:
    """Validate a resize and return the new layout, or raise ``ResizeRefused``.

    The cutover must be on a bucket boundary, after the latest layout's start, and no
    earlier than :func:`earliest_cutover_ms`.
    """
    from .keys import bucket_of_ms, from_ms

    check_shard_count(count)
    earliest = earliest_cutover_ms(now_ms, cache_ttl_ms, late_margin_ms, max_skew_ms)
    # Round the earliest time up to a bucket boundary: that is the first legal cutover.
    earliest_bucket = bucket_of_ms(earliest + width_s * 1000 - 1, width_s)
    width_ms = width_s * 1000
    if cutover_ms % width_ms:
        suggestion = max(earliest_bucket * 1000, cutover_ms - cutover_ms % width_ms + width_ms)
        raise ResizeRefused(
            f"cutover {from_ms(cutover_ms).isoformat()} is not on a {width_s}s bucket boundary; "
            f"use e.g. {from_ms(suggestion).isoformat()}"
        )
    cutover_bucket = cutover_ms // 1000
    if cutover_bucket < earliest_bucket:
        raise ResizeRefused(
            f"cutover {from_ms(cutover_ms).isoformat()} is too early: producers may still hold "
            f"the old layout; the earliest allowed cutover is {from_ms(earliest_bucket * 1000).isoformat()}"
        )
    if cutover_bucket <= layouts.latest.from_bucket:
        raise ResizeRefused(
            f"cutover {from_ms(cutover_ms).isoformat()} is not after the latest layout "
            f"(from {from_ms(layouts.latest.from_bucket * 1000).isoformat()}); pick a later time"
        )
    return Layout(from_bucket=cutover_bucket, shard_count=count, created_ms=now_ms)
