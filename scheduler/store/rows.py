"""Row <-> Job conversion shared by both stores (column order of the named queries)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..domain.flow import DEFAULT_PRIORITY, PRIORITIES
from ..domain.model import POISON_KIND, Job, Status
from ..domain.retention import DEFAULT_DEAD_RETENTION_S, DEFAULT_RETENTION_S, Retention
from ..domain.traceparent import stored_traceparent
from ..recurring.rule import Rule
from ..recurring.schedule import Misfire, Overlap, Schedule, State

_PRIORITIES = frozenset(PRIORITIES)


def priority_of(value: Any) -> int:
    """A stored priority: None (a row written before schema v007) is the default; a whole
    number outside 0-9 (written by a producer outside the client's checks) is clamped to
    0-9 rather than making the row unreadable. Anything else raises ``ValueError``, and
    the row is a poison row (``jobs_from_bucket_rows``)."""
    if value is None:
        return DEFAULT_PRIORITY
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"priority {value!r} is not a whole number")
    return min(max(value, PRIORITIES[0]), PRIORITIES[-1])


def key_of(value: Any) -> str | None:
    """A stored key: None, or text. Anything else (a blob written past the client's checks
    into SQLite's dynamically typed column) raises ``ValueError``: a poison row."""
    if value is None or isinstance(value, str):
        return value
    raise ValueError(f"key {type(value).__name__} is not text")


def job_from_row(row: Any, to_ms: Any = int) -> Job:
    """Build a Job from ``select_job``'s column order; ``to_ms`` converts timestamps."""
    (job_id, kind, payload, payload_json, due_at, fire_at, bucket, shard, status, attempts,
     fired_at, last_error, priority, key, traceparent) = row
    return Job(
        job_id=job_id,
        kind=kind or "",
        data=bytes(payload or b""),
        data_json=bool(payload_json),
        due_ms=0 if due_at is None else to_ms(due_at),
        fire_ms=0 if fire_at is None else to_ms(fire_at),
        bucket=int(bucket or 0),
        shard=int(shard or 0),
        status=Status(status or "pending"),
        attempts=int(attempts or 0),
        fired_ms=None if fired_at is None else to_ms(fired_at),
        last_error=last_error,
        priority=priority_of(priority),
        key=key_of(key),
        traceparent=None if traceparent is None else stored_traceparent(traceparent),
    )


def job_from_bucket_row(row: Any, to_ms: Any = int) -> Job:
    """Build a Job from ``select_bucket_rows``'s column order: pending, or fired when the
    row has ``fired_at``. A row left by a fire record racing a delete has no kind; a row
    written before schema v007 has no priority (the default) and no key; one written
    before v010, or by a producer that traced nothing, no traceparent. A stored traceparent
    that is not one is ignored (``stored_traceparent``), never a poison row: the job can run.
    (Positional arguments: this runs once per row a poller reads.)"""
    (bucket, shard, fire_at, job_id, due_at, kind, payload, payload_json, attempts, fired_at,
     priority, key, traceparent) = row
    return Job(job_id, kind or "", payload or b"", bool(payload_json),
               0 if due_at is None else to_ms(due_at), to_ms(fire_at), bucket, shard,
               Status.PENDING if fired_at is None else Status.FIRED, attempts or 0,
               None if fired_at is None else to_ms(fired_at), None,
               priority if priority in _PRIORITIES else priority_of(priority),
               key if key is None or type(key) is str else key_of(key),
               None if traceparent is None else stored_traceparent(traceparent))


def fired_keys(batches: Iterable[Sequence[Any]],
               upto: tuple[int, str] | None = None) -> dict[tuple[int, str], int]:
    """When each listed row fired, by key ``(fire_ms, job_id)``, from rows of Cassandra's
    ``fired_batches`` (``select_fired_batches_from``: at, first fire, first id, fire
    times, ids): the latest ``at`` of the batches listing it (a retried write lists a
    row twice). Batches whose first key is after ``upto`` are skipped unread."""
    out: dict[tuple[int, str], int] = {}
    for batch in batches:
        try:
            at, first_fire, first_id, fires, ids = batch
            if upto is not None and (int(first_fire), first_id) > upto:
                continue
            listed = dict.fromkeys(zip(map(int, fires), map(str, ids), strict=True), int(at))
        except (TypeError, ValueError):
            # A row not written by a poller (by hand, or damaged): its rows read as pending,
            # which costs at most a duplicate; failing every read of the partition would
            # stop its shard.
            continue
        for key, when in listed.items():
            if out.get(key, -1) < when:
                out[key] = when
    return out


def derive_fired(rows: list[Job], fired: Mapping[tuple[int, str], int]) -> list[Job]:
    """``rows`` with the batches of firings applied: a row with no ``fired_at`` whose key
    ``fired`` lists (``fired_keys``) is fired at that time; every other row as read."""
    if not fired:
        return rows
    out: list[Job] = []
    for row in rows:
        if row.fired_ms is None and (at := fired.get((row.fire_ms, row.job_id))) is not None:
            row = row.evolve(status=Status.FIRED, fired_ms=at)
        out.append(row)
    return out


def jobs_from_bucket_rows(rows: Sequence[Any], to_ms: Any = int) -> list[Job]:
    """``job_from_bucket_row`` over a page. A row that cannot be turned into a job (one
    written by another producer, outside the client's checks) becomes a *poison* job
    (kind ``POISON_KIND``, the reason in ``last_error``), so the poller dead-letters it
    and its shard keeps firing instead of failing on every read."""
    try:
        return [job_from_bucket_row(r, to_ms) for r in rows]
    except Exception:
        return [_row_or_poison(r, to_ms) for r in rows]


def _row_or_poison(row: Any, to_ms: Any) -> Job:
    try:
        return job_from_bucket_row(row, to_ms)
    except Exception as exc:
        bucket, shard, fire_at, job_id = row[0], row[1], row[2], row[3]
        fire = int(fire_at) if isinstance(fire_at, int) else to_ms(fire_at)
        return Job(str(job_id), POISON_KIND, b"", False, fire, fire, int(bucket), int(shard),
                   Status.PENDING, 0, None,
                   f"poison row: cannot be read as a job ({type(exc).__name__}: {exc})"[:2000])


def job_params(job: Job, ts: Any = int, absent: Any = None) -> tuple[Any, ...]:
    """Parameters of ``insert_job``; ``ts`` converts epoch ms to the store's type;
    ``absent`` stands for no traceparent (Cassandra binds the driver's unset value: no
    cell is written, where a null would write a tombstone in every untraced job's row)."""
    return (job.job_id, job.kind, job.data, job.data_json, ts(job.due_ms),
            ts(job.fire_ms), job.bucket, job.shard, str(job.status), job.attempts,
            None if job.fired_ms is None else ts(job.fired_ms), job.last_error, job.priority, job.key,
            absent if job.traceparent is None else job.traceparent)


def bucket_params(job: Job, ts: Any = int, absent: Any = None) -> tuple[Any, ...]:
    """Parameters of ``insert_bucket_row`` (``absent``: see ``job_params``)."""
    return (job.bucket, job.shard, ts(job.fire_ms), job.job_id, ts(job.due_ms), job.kind,
            job.data, job.data_json, job.attempts, job.priority, job.key,
            absent if job.traceparent is None else job.traceparent)


def partition_chunks(rows: list[tuple[Job, Any]], max_bytes: int,
                     max_rows: int) -> list[list[tuple[Job, Any]]]:
    """``rows`` (a job and its parameters) grouped by bucket partition, in chunks of at
    most ``max_rows`` rows and about ``max_bytes`` (a batch past Cassandra's warning
    size costs the coordinator more than the round trips it saves)."""
    by_partition: dict[tuple[int, int], list[tuple[Job, Any]]] = {}
    for row in rows:
        by_partition.setdefault((row[0].bucket, row[0].shard), []).append(row)
    chunks: list[list[tuple[Job, Any]]] = []
    for group in by_partition.values():
        size = max_bytes + 1
        for row in group:
            job = row[0]
            row_size = len(job.data) + len(job.job_id) + len(job.kind) + 64
            if size + row_size > max_bytes or len(chunks[-1]) >= max_rows:
                chunks.append([])
                size = 0
            chunks[-1].append(row)
            size += row_size
    return chunks


def done_bucket_params(job: Job, fired_ms: int | None, ts: Any = int, absent: Any = None) -> tuple[Any, ...]:
    """Parameters of ``insert_bucket_row_full``: the whole row, ``fired_at`` included (a
    retired row has one, so pollers skip it; a re-armed row has None)."""
    return (*bucket_params(job, ts, absent), None if fired_ms is None else ts(fired_ms))


def bucket_key(job: Job, ts: Any = int) -> tuple[Any, ...]:
    """The primary key of a job's bucket row."""
    return (job.bucket, job.shard, ts(job.fire_ms), job.job_id)


def meta_items(options: Any, origin_bucket: int) -> list[tuple[str, str]]:
    """The keyspace settings written when missing (later applies keep the first)."""
    return [
        ("bucket_width_s", str(options.bucket_width_s)),
        ("late_margin_ms", str(options.late_margin_ms)),
        ("max_skew_ms", str(options.max_skew_ms)),
        ("origin_bucket", str(origin_bucket)),
        ("retention_s", str(options.retention_s or DEFAULT_RETENTION_S)),
        ("dead_retention_s", str(options.dead_retention_s or DEFAULT_DEAD_RETENTION_S)),
    ]


def retention_changes(options: Any, existing: dict[str, str]) -> list[tuple[str, str]]:
    """The retention settings ``options`` changes in a keyspace that has ``existing``."""
    out = []
    for key, value in (("retention_s", options.retention_s), ("dead_retention_s", options.dead_retention_s)):
        if value is not None and key in existing and existing[key] != str(value):
            out.append((key, str(value)))
    return out


def retention_of(raw: dict[str, str]) -> Retention:
    return Retention(int(raw.get("retention_s", DEFAULT_RETENTION_S)),
                     int(raw.get("dead_retention_s", DEFAULT_DEAD_RETENTION_S)))


def schedule_params(s: Schedule) -> tuple[Any, ...]:
    """Parameters of ``insert_schedule`` (and ``replace_schedule``'s SET list)."""
    r = s.rule
    return (s.schedule_id, s.version, str(s.state), s.kind, s.payload, s.payload_json, r.cron, r.every_s,
            r.tz, r.anchor_ms, s.start_ms, s.end_ms, str(s.overlap), str(s.misfire), s.catchup_window_s,
            s.jitter_s, s.created_ms, s.updated_ms, s.priority, s.key)


def schedule_from_row(row: Any, skipped: int = 0) -> Schedule:
    """A Schedule from ``select_schedule``'s column order."""
    (sid, version, state, kind, payload, payload_json, cron, every_s, tz, anchor_ms, start_ms, end_ms,
     overlap, misfire, window, jitter, created, updated, priority, key) = row[:20]
    rule = Rule(cron=cron, every_s=None if every_s is None else int(every_s), tz=tz or "UTC",
                anchor_ms=int(anchor_ms or 0))
    return Schedule(sid, kind, rule, bytes(payload or b""), bool(payload_json),
                    None if start_ms is None else int(start_ms), None if end_ms is None else int(end_ms),
                    Overlap(overlap), Misfire(misfire), int(window), int(jitter), int(version),
                    State(state), int(created or 0), int(updated or 0), skipped,
                    priority_of(priority), key)
