"""What operators look at: per-shard checkpoint lag and due backlog, a bucket's rows, and
the jobs due ahead. Everything here is read from the store (and, when given, a
ZooKeeper snapshot), never from pollers, so it still tells the truth when every poller
is dead: that is the quiet failure this module exists for.

Definitions (documented in the README under "Lag"):

- **lag** of a shard = now - the end of its last drained bucket. A healthy shard stays
  between the late margin and one bucket width plus a poll interval above it.
- **due backlog** = rows of the shard that are due (``fire_at <= now``), past its
  checkpoint, and not fired.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..domain.assign import live_shards
from ..domain.home import home_of
from ..domain.keys import bucket_of, bucket_of_ms, from_ms
from ..domain.model import Job, Status, parse_time
from ..errors import InvalidInput
from ..fleet.view import FleetSnapshot
from ..store.base import PartRange, ShardCheckpoint
from ..store.roles import Meta, RowReads, ShardReads, TimedReads

# How many buckets past a checkpoint the backlog count reads per shard: a day of
# minute buckets. Beyond that the figure is a lower bound (``backlog_capped``).
MAX_SCAN_BUCKETS = 1440
# Partitions counted per store call: bounds memory and lets a progress bar move.
COUNT_CHUNK = 512


@dataclass(frozen=True)
class ShardLag:
    shard: int
    owner: str | None  # from ZooKeeper when given, else the checkpoint's owner column
    drained_until_ms: int  # end of the last drained bucket: everything before it fired
    lag_s: float
    backlog: int
    backlog_capped: bool
    updated_ms: int | None
    oldest_due_ms: int | None = None  # the oldest of the backlog's jobs (when it should fire)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["drained_until"] = from_ms(self.drained_until_ms).isoformat()
        out["updated_at"] = None if self.updated_ms is None else from_ms(self.updated_ms).isoformat()
        out["oldest_due_at"] = None if self.oldest_due_ms is None else from_ms(self.oldest_due_ms).isoformat()
        return out


def _width_and_initial(store: Meta) -> tuple[int, int]:
    """Bucket width, and the checkpoint a shard without one starts from."""
    meta = store.meta()
    return meta.bucket_width_s, meta.origin_bucket - meta.bucket_width_s


def lag_report(store: ShardReads, now_ms: int, fleet: FleetSnapshot | None = None,
               max_scan_buckets: int = MAX_SCAN_BUCKETS) -> list[ShardLag]:
    """One row per live shard, worst first (largest lag, then largest backlog).

    A shard that never had a checkpoint is reported from the store's origin bucket, as a
    poller would start it. Raises ``StoreUnavailable`` when the store cannot be read."""
    width, initial = _width_and_initial(store)
    layouts = store.layouts()
    saved: dict[int, ShardCheckpoint] = {cp.shard: cp for cp in store.checkpoints()}
    shards = sorted(live_shards(layouts, {s: cp.drained for s, cp in saved.items()}, width))
    now_bucket = bucket_of_ms(now_ms, width)
    parts: list[PartRange] = []
    owner_of: list[int] = []
    capped: set[int] = set()
    for shard in shards:
        cp = saved.get(shard)
        first = (cp.drained if cp else initial) + width
        last = min(now_bucket, first + (max_scan_buckets - 1) * width)
        if last < now_bucket:
            capped.add(shard)
        for bucket in range(first, last + 1, width):
            if shard < layouts.read_count(bucket):
                after = cp.done_cursor if cp is not None and bucket == first else None
                parts.append((bucket, shard, after, now_ms))
                owner_of.append(shard)
    backlog: dict[int, int] = defaultdict(int)
    oldest: dict[int, int] = {}
    for i in range(0, len(parts), COUNT_CHUNK):
        for shard, (n, first_ms) in zip(owner_of[i:i + COUNT_CHUNK],
                                        store.pending(parts[i:i + COUNT_CHUNK]), strict=True):
            backlog[shard] += n
            if first_ms is not None and (shard not in oldest or first_ms < oldest[shard]):
                oldest[shard] = first_ms
    rows = []
    for shard in shards:
        cp = saved.get(shard)
        drained = cp.drained if cp else initial
        # ZooKeeper knows who holds a lock now; the owner column may name a dead poller.
        owner = fleet.owners.get(shard) if fleet is not None else (cp.owner if cp else None)
        end_ms = (drained + width) * 1000
        rows.append(ShardLag(shard, owner, end_ms, round(max(0.0, (now_ms - end_ms) / 1000), 3),
                             backlog[shard], shard in capped, cp.updated_ms if cp else None,
                             oldest.get(shard)))
    rows.sort(key=lambda r: (-r.lag_s, -r.backlog, r.shard))
    return rows


def bucket_rows(store: RowReads, bucket: int, shard: int | None, limit: int = 100_000,
                after: tuple[int, str] | None = None) -> list[Job]:
    """Every row of a bucket (fired ones included), of one shard or of all its shards:
    at most ``limit`` per shard, after the key ``(fire_ms, job_id)`` when given."""
    width, _ = _width_and_initial(store)
    count = store.layouts().read_count(bucket)
    shards = [shard] if shard is not None else list(range(count))
    end_ms = (bucket + width) * 1000 - 1
    out: list[Job] = []
    for s in shards:
        out.extend(store.read_bucket(bucket, s, after, end_ms, limit))
    # A cancelled job's row is retired (marked done), not deleted: its lookup row says why
    # (the lookup rows as stored: the bucket rows read already say what fired).
    done = store.lookup_rows([j.job_id for j in out if j.fired_ms is not None])

    def cancelled(j: Job) -> bool:
        d = done.get(j.job_id)
        return d is not None and d.status is Status.CANCELLED and d.fire_ms == j.fire_ms

    return [j.evolve(status=Status.CANCELLED) if cancelled(j) else j for j in out]


@dataclass(frozen=True)
class Forecast:
    bucket_width_s: int
    from_bucket: int
    per_bucket: dict[int, int]  # bucket -> jobs due in it
    per_shard: dict[int, int]  # shard -> jobs due over the window
    cells: dict[tuple[int, int], int]  # (bucket, shard) -> jobs, non-zero only

    @property
    def total(self) -> int:
        return sum(self.per_bucket.values())


def forecast(store: TimedReads, now_ms: int, hours: float,
             progress: Callable[[int, int], None] | None = None) -> Forecast:
    """Pending jobs per bucket and per shard from the current bucket to ``hours`` ahead.

    One count per (bucket, shard) partition, so it costs S * buckets small reads and
    nothing for jobs stored further out. ``progress(done, total)`` is called per chunk."""
    width, _ = _width_and_initial(store)
    layouts = store.layouts()
    first = bucket_of_ms(now_ms, width)
    last = bucket_of_ms(now_ms + int(hours * 3_600_000), width)
    parts: list[PartRange] = [(b, s, None, (b + width) * 1000 - 1)
                              for b in range(first, last + 1, width)
                              for s in range(layouts.read_count(b))]
    per_bucket = {b: 0 for b in range(first, last + 1, width)}
    per_shard: dict[int, int] = defaultdict(int)
    cells: dict[tuple[int, int], int] = {}
    for i in range(0, len(parts), COUNT_CHUNK):
        chunk = parts[i:i + COUNT_CHUNK]
        for (bucket, shard, _, _), n in zip(chunk, store.count_pending(chunk), strict=True):
            if n:
                per_bucket[bucket] += n
                per_shard[shard] += n
                cells[(bucket, shard)] = n
        if progress:
            progress(min(i + COUNT_CHUNK, len(parts)), len(parts))
    return Forecast(width, first, per_bucket, dict(per_shard), cells)


@dataclass(frozen=True)
class FleetStatus:
    members: list[str] | None  # None: no ZooKeeper to ask (local coordination)
    shards_per_owner: dict[str, list[int]]
    unowned: list[int]
    layouts: list[dict[str, Any]]
    worst: ShardLag | None
    dcs: dict[str, str | None] = field(default_factory=dict)  # poller -> the DC it advertises
    weights: dict[str, int] = field(default_factory=dict)  # the home-DC rule ({}: none)
    foreign: list[int] = field(default_factory=list)  # shards held by a poller outside their home DC


def fleet_status(store: ShardReads, now_ms: int, fleet: FleetSnapshot | None,
                 lags: list[ShardLag] | None = None) -> FleetStatus:
    """Pollers, the shards each owns, shards nobody owns, the layouts and the worst lag."""
    lags = lag_report(store, now_ms, fleet) if lags is None else lags
    per_owner: dict[str, list[int]] = defaultdict(list)
    unowned = []
    for row in sorted(lags, key=lambda r: r.shard):
        if row.owner:
            per_owner[row.owner].append(row.shard)
        else:
            unowned.append(row.shard)
    if fleet is not None:
        for member in fleet.members:
            per_owner.setdefault(member, [])
    lays = [{"from": from_ms(lay.from_bucket * 1000).isoformat(), "from_bucket": lay.from_bucket,
             "shard_count": lay.shard_count} for lay in store.layouts().items]
    dcs = dict(fleet.dcs) if fleet is not None else {}
    weights = dict(fleet.weights) if fleet is not None else {}
    foreign = sorted(s for m, mine in per_owner.items() for s in mine
                     if weights and m in dcs and dcs[m] != home_of(s, weights))
    return FleetStatus(None if fleet is None else fleet.members, dict(sorted(per_owner.items())),
                       unowned, lays, lags[0] if lags else None, dcs, weights, foreign)


def shard_ranges(shards: list[int]) -> str:
    """``0-3,7,9-10``: the shards as ranges. Pure."""
    out: list[str] = []
    for s in sorted(shards):
        if out and out[-1].split("-")[-1] == str(s - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{s}"
        else:
            out.append(str(s))
    return ",".join(out)


def parse_bucket(text: str, width: int) -> int:
    """A bucket's start (epoch seconds) from its epoch seconds or any ISO 8601 time in
    it; ``InvalidInput`` saying which forms are accepted otherwise. Pure."""
    if text.isascii() and text.lstrip("-").isdigit():  # not "²", which isdigit() but int() refuses
        bucket = int(text)
        if bucket % width:
            raise InvalidInput(f"bucket {bucket} is not a multiple of the bucket width {width} s; "
                               "pass a bucket's start in epoch seconds or an ISO 8601 time")
        return bucket
    try:
        return bucket_of(parse_time(text), width)
    except InvalidInput:
        raise InvalidInput(f"bucket {text!r} is neither epoch seconds nor an ISO 8601 time "
                           "with an offset (e.g. 2026-12-01T09:00Z)") from None
