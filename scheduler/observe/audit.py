"""The completeness audit: did every job written in a time range fire (or end otherwise)?

For each bucket of the range and each shard that bucket's layouts have, it reads the
partition once (all partitions of a chunk at once, paged) and the lookup rows of the
jobs found there (``lookup_rows``, concurrent), and counts each row as

- ``fired``: its bucket row is marked and its lookup row points here (status fired);
- ``cancelled`` / ``dead``: marked, and the lookup row says so;
- ``moved``: the lookup row points at another position (rescheduled, or retried
  elsewhere: the row here was retired when the job moved);
- ``pending``: not marked yet.

A **violation** is a pending row at a position its shard's checkpoint has passed (the
drained bucket, or the done cursor within the next one) whose lookup row does not say
it was cancelled, dead or moved: nobody will read it again, so it would never fire: a
lost job. Rows written behind a checkpoint by the late-write rule cannot exist (a
producer places a job at least the late margin ahead of every cursor), so anything
found there is a fault.

A lookup row that points at no bucket row is flagged too, for every job that has a
row in the range: a row counted ``moved`` sends the audit to the position its lookup row
names (one small read per moved job), where a bucket row must be. A lookup row whose job
has no row at all in the range (its bucket row never written, or lost) can only be found
from the lookup side, which has no bucket index: ``lookups=True`` (``--lookups``) also
reads the whole lookup table once, streamed, and flags every lookup row that points into
the range at a position where no bucket row was read. That costs a read of every job
stored, whatever the range, so it is opt-in. Rows past their retention are gone from
both tables (their TTLs are written together, so neither outlives the other by more
than the write's own duration).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..domain.keys import bucket_of_ms, from_ms
from ..domain.model import Job, Status
from ..store.base import ShardCheckpoint
from ..store.roles import AuditReads, BucketReads, JobReads

HOUR_MS = 3_600_000
DANGLING = "its lookup row points at no bucket row"
PAGE_ROWS = 1000
LOOKUP_IDS = 4096  # lookup rows read per call (Cassandra: 64 concurrent IN reads of 64)
PARTS_AT_ONCE = 64
CATEGORIES = ("written", "fired", "cancelled", "dead", "moved", "pending")


@dataclass
class PartCount:
    bucket: int
    shard: int
    written: int = 0
    fired: int = 0
    cancelled: int = 0
    dead: int = 0
    moved: int = 0
    pending: int = 0


@dataclass(frozen=True)
class Violation:
    bucket: int
    shard: int
    fire_ms: int
    job_id: str
    reason: str


@dataclass
class AuditReport:
    from_bucket: int
    to_bucket: int
    partitions: list[PartCount] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)

    def totals(self) -> dict[str, int]:
        return {c: sum(getattr(p, c) for p in self.partitions) for c in CATEGORIES}

    def window(self) -> str:
        first, last = (from_ms(b * 1000).isoformat() for b in (self.from_bucket, self.to_bucket))
        return f"buckets {first} to {last}"

    def as_dict(self) -> dict[str, Any]:
        return {"from_bucket": self.from_bucket, "to_bucket": self.to_bucket,
                "partitions": len(self.partitions), "totals": self.totals(),
                "violations": [asdict(v) for v in self.violations]}


def last_closed_hour(now_ms: int) -> tuple[int, int]:
    """The hour before the current one, as (first ms, last ms) inclusive. Pure."""
    start = (now_ms // HOUR_MS - 1) * HOUR_MS
    return start, start + HOUR_MS - 1


def passed(cp: ShardCheckpoint | None, row: Job, width_s: int) -> bool:
    """Whether the shard's checkpoint has passed ``row``'s position. Pure."""
    if cp is None:
        return False
    if row.bucket <= cp.drained:
        return True
    return (row.bucket == cp.drained + width_s and cp.done_cursor is not None
            and (row.fire_ms, row.job_id) <= tuple(cp.done_cursor))


def classify(row: Job, lookup: Job | None) -> str:
    """The category of one bucket row, given its job's lookup row (None: expired or
    never written). Pure."""
    here = (row.bucket, row.fire_ms, row.shard)
    if lookup is not None and (lookup.bucket, lookup.fire_ms, lookup.shard) != here:
        return "moved"
    if lookup is not None and lookup.status in (Status.CANCELLED, Status.DEAD):
        return lookup.status.value
    return "pending" if row.fired_ms is None else "fired"


def audit(store: AuditReads, from_ms: int, to_ms: int,
          progress: Callable[[int, int], None] | None = None, lookups: bool = False) -> AuditReport:
    """Audit every bucket from ``from_ms`` to ``to_ms`` (inclusive); with ``lookups``,
    scan the lookup table too (see above). ``progress`` gets (partitions done, partitions
    in all). Read-only; raises the store's errors (``StoreUnavailable``)."""
    width = store.meta().bucket_width_s
    layouts = store.layouts()
    checkpoints = {cp.shard: cp for cp in store.checkpoints()}
    first, last = bucket_of_ms(from_ms, width), bucket_of_ms(to_ms, width)
    parts = [(b, s) for b in range(first, last + 1, width) for s in range(layouts.read_count(b))]
    report = AuditReport(first, last)
    moved: dict[str, Job] = {}
    # The positions of the bucket rows read, as hashes (8 bytes each: 1,000,000 rows in
    # tens of MB); only for the lookup scan. A collision (about 1 in 10^7 at 10^6 rows)
    # would hide one dangling lookup row.
    seen: set[int] | None = set() if lookups else None
    for i in range(0, len(parts), PARTS_AT_ONCE):
        chunk = parts[i:i + PARTS_AT_ONCE]
        found = read_partitions(store, chunk)
        if seen is not None:
            seen.update(hash((r.job_id, r.bucket, r.shard, r.fire_ms)) for rows in found for r in rows)
        # The lookup rows of the whole chunk at once (the bucket rows say what fired).
        by_id = lookup_rows(store, [r.job_id for rows in found for r in rows])
        for (bucket, shard), rows in zip(chunk, found, strict=True):
            report.partitions.append(_count(bucket, shard, rows, by_id, checkpoints.get(shard), width,
                                            report.violations, moved))
        if progress is not None:
            progress(min(i + PARTS_AT_ONCE, len(parts)), len(parts))
    found_dangling = dangling(store, list(moved.values()))
    if seen is not None:
        found_dangling += [
            Violation(b, s, f, j, DANGLING) for j, b, s, f in store.lookup_positions(first, last)
            if s < layouts.read_count(b) and hash((j, b, s, f)) not in seen]
    unique = {(v.job_id, v.bucket, v.shard, v.fire_ms): v for v in found_dangling}
    report.violations.extend(sorted(unique.values(), key=lambda v: (v.bucket, v.shard, v.fire_ms, v.job_id)))
    return report


def dangling(store: BucketReads, lookups: Sequence[Job]) -> list[Violation]:
    """The lookup rows among ``lookups`` whose position holds no bucket row (read at
    once, PARTS_AT_ONCE at a time). Read-only; raises the store's errors."""
    out = []
    for i in range(0, len(lookups), PARTS_AT_ONCE):
        chunk = lookups[i:i + PARTS_AT_ONCE]
        # Strictly after (fire_ms - 1, the largest id) and up to fire_ms: the rows at fire_ms.
        found = store.read_buckets([(j.bucket, j.shard, (j.fire_ms - 1, "\U0010ffff"), j.fire_ms)
                                    for j in chunk], PAGE_ROWS)
        for j, rows in zip(chunk, found, strict=True):
            if not any(r.job_id == j.job_id for r in rows):
                out.append(Violation(j.bucket, j.shard, j.fire_ms, j.job_id, DANGLING))
    return out


def lookup_rows(store: JobReads, ids: Sequence[str]) -> dict[str, Job]:
    """The lookup rows of ``ids`` as stored, ``LOOKUP_IDS`` per call. Read-only; raises
    the store's errors."""
    out: dict[str, Job] = {}
    for k in range(0, len(ids), LOOKUP_IDS):
        out.update(store.lookup_rows(ids[k:k + LOOKUP_IDS]))
    return out


def read_partitions(store: BucketReads, parts: Sequence[tuple[int, int]]) -> list[list[Job]]:
    """Every row of each partition: all at once, then page by page the full ones."""
    found = store.read_buckets([(b, s, None, 2**62) for b, s in parts], PAGE_ROWS)
    out = []
    for (bucket, shard), rows in zip(parts, found, strict=True):
        rows = list(rows)
        page = rows
        while len(page) >= PAGE_ROWS:
            page = store.read_bucket(bucket, shard, (rows[-1].fire_ms, rows[-1].job_id), 2**62, PAGE_ROWS)
            rows.extend(page)
        out.append(rows)
    return out


def _count(bucket: int, shard: int, rows: list[Job], lookups: dict[str, Job], cp: ShardCheckpoint | None,
           width: int, violations: list[Violation], moved: dict[str, Job]) -> PartCount:
    count = PartCount(bucket, shard, written=len(rows))
    for row in rows:
        lookup = lookups.get(row.job_id)
        category = classify(row, lookup)
        setattr(count, category, getattr(count, category) + 1)
        if category == "moved" and lookup is not None:
            moved[row.job_id] = lookup
        if category == "pending" and passed(cp, row, width):
            violations.append(Violation(bucket, shard, row.fire_ms, row.job_id,
                                        "not fired, and its shard's checkpoint has passed it"))
    return count


def behind(store: AuditReads, shard: int, first_bucket: int, last_bucket: int) -> list[Job]:
    """The rows of ``shard`` in the buckets ``first_bucket`` to ``last_bucket`` that the
    audit would call violations: pending (no outcome recorded, and the lookup row still
    names this position, not cancelled or dead) at a position the shard's checkpoint has
    passed. These are what a catch-up moves ahead of the cursor. Buckets whose layout
    has fewer shards are skipped. Read-only; raises the store's errors."""
    width = store.meta().bucket_width_s
    layouts = store.layouts()
    cp = next((c for c in store.checkpoints() if c.shard == shard), None)
    parts = [(b, shard) for b in range(first_bucket, last_bucket + 1, width) if shard < layouts.read_count(b)]
    out: list[Job] = []
    for i in range(0, len(parts), PARTS_AT_ONCE):
        rows = [r for found in read_partitions(store, parts[i:i + PARTS_AT_ONCE]) for r in found
                if r.fired_ms is None and passed(cp, r, width)]
        by_id = lookup_rows(store, [r.job_id for r in rows])
        out += [r for r in rows if classify(r, by_id.get(r.job_id)) == "pending"]
    return out
