"""The store seen by role: small protocols, each the part of ``Store`` one kind of
consumer calls, as procrastinate's connector and dramatiq's broker keep the interface a
consumer sees small. ``Store`` (``base.py``) stays the one full class both stores
inherit; it satisfies every protocol here structurally (``tests/unit/test_store_roles.py``
checks that, and that every public method of ``Store`` is in at least one protocol).

A consumer is annotated with the narrowest protocol, or an intersection of a few, that
it calls, so mypy proves it calls nothing else. What each method promises under failure
is in its docstring on ``Store``. The producer's rules name store methods by string
(``scheduler.domain.effects.call``): mypy cannot see those, so the test checks each such
module's names against the protocols it is meant to use.

The roles, and who uses them:

- ``Meta``: keyspace settings, layouts, the store's clock (everyone).
- ``JobReads``: jobs by id (the producer, the audit, the views).
- ``JobWrites``: new jobs, moves, cancels, layouts (the producer, occurrences).
- ``BucketReads``: a shard's bucket partitions (the poller's reader, the audit, lag).
- ``Firing``: outcomes of fired jobs (the poller's recorder).
- ``Ownership``: claiming, checkpointing and releasing shards (the poller).
- ``Checkpoints``: where each shard and poller stands, read-only (views, the nudger).
- ``DeadLetters``: dead letters, their replays (the client, the console).
- ``Schedules``: recurring schedules' rows (the client, the poller's gate, chains).
- ``Flow``: flow control's limits and pauses per kind, and the pollers' demand (the
  CLI's ``limits`` and ``kinds``, the poller's flow control, the console).
- ``Schema``: creating and upgrading the schema (``schema apply``, the demo).
- ``Connection``: the store's URL, closing it, the asyncio door (the client).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from ..domain.flow import Demand, Limits
from ..domain.layout import Layout, Layouts
from ..domain.model import Job
from ..domain.progress import Checkpoint
from ..domain.retention import Retention
from ..recurring.schedule import Schedule
from .base import (
    DeadLetter,
    PartRange,
    ProgressFn,
    SchemaOptions,
    SchemaResult,
    ShardCheckpoint,
    StoreMeta,
)
from .flow import DemandEntry
from .history import Replay

__all__ = [
    "ROLES",
    "AuditReads",
    "BucketReads",
    "Checkpoints",
    "Connection",
    "DeadLetters",
    "ExporterReads",
    "Firing",
    "Flow",
    "JobReads",
    "JobWrites",
    "Meta",
    "Ownership",
    "RowReads",
    "ScheduleReads",
    "Schedules",
    "Schema",
    "ShardReads",
    "TimedReads",
]


class Meta(Protocol):
    """Keyspace settings, shard layouts and the store's own clock."""

    def meta(self) -> StoreMeta: ...
    def layouts(self) -> Layouts: ...
    @property
    def retention(self) -> Retention: ...
    def server_now_ms(self) -> int: ...


class JobReads(Protocol):
    """Jobs by id, and the lookup rows behind them."""

    def get(self, job_id: str) -> Job | None: ...
    def get_many(self, job_ids: Sequence[str]) -> dict[str, Job]: ...
    def lookup_rows(self, job_ids: Sequence[str]) -> dict[str, Job]: ...
    def lookup_positions(self, first_bucket: int,
                         last_bucket: int) -> Iterator[tuple[str, int, int, int]]: ...


class JobWrites(Protocol):
    """A producer's writes: new jobs, moves, cancels, and the layouts they land in."""

    def insert_many(self, jobs: Sequence[Job], progress: ProgressFn | None = None) -> None: ...
    def insert_once(self, jobs: Sequence[Job], written_ms: int) -> None: ...
    def move(self, old: Job, new: Job) -> None: ...
    def move_many(self, pairs: Sequence[tuple[Job, Job]]) -> None: ...
    def cancel(self, job: Job) -> None: ...
    def insert_layout(self, layout: Layout) -> bool: ...
    def insert_mark(self, from_bucket: int, mark_end: int) -> None: ...


class BucketReads(Protocol):
    """The rows of bucket partitions, and counts of the ones not fired yet."""

    def read_bucket(self, bucket: int, shard: int, after: tuple[int, str] | None,
                    until_ms: int, limit: int) -> list[Job]: ...
    def read_buckets(self, parts: Sequence[PartRange], limit: int) -> list[list[Job]]: ...
    def count_pending(self, parts: Sequence[PartRange]) -> list[int]: ...
    def pending(self, parts: Sequence[PartRange]) -> list[tuple[int, int | None]]: ...


class Firing(Protocol):
    """What a poller's recorder writes: the outcome of each job it fired or skipped."""

    def record_fired(self, jobs: Sequence[Job], fired_ms: int) -> None: ...
    def record_retry(self, old: Job, new: Job, error: str, now_ms: int) -> None: ...
    def record_dead(self, job: Job, error: str, now_ms: int) -> None: ...
    def record_skipped(self, job: Job, reason: str, now_ms: int) -> None: ...
    def add_skipped(self, schedule_id: str, n: int) -> None: ...


class Ownership(Protocol):
    """A poller's fenced hold on its shards, where it listens for nudges, and whether
    the other DCs' nodes are reachable (``peers_down``: the catch-up after a cut)."""

    def claim_shard(self, shard: int, owner: str, epoch: int, initial_drained: int,
                    now_ms: int, *, global_fence: bool = False) -> Checkpoint: ...
    def take_released_shard(self, shard: int, owner: str, epoch: int, seen_epoch: int, now_ms: int,
                            *, global_fence: bool = False) -> Checkpoint: ...
    def save_checkpoint(self, shard: int, epoch: int, checkpoint: Checkpoint, now_ms: int) -> None: ...
    def release_shard(self, shard: int, epoch: int, now_ms: int) -> bool: ...
    def set_notify_endpoint(self, owner: str, address: str | None, now_ms: int) -> None: ...
    def peers_down(self) -> int: ...


class Checkpoints(Protocol):
    """Where every shard stands and where every live poller listens, read-only."""

    def checkpoints(self) -> list[ShardCheckpoint]: ...
    def notify_endpoints(self, now_ms: int) -> dict[str, str]: ...


class DeadLetters(Protocol):
    """Dead letters, and replaying them."""

    def dead_letters(self) -> list[DeadLetter]: ...
    def dead_letter_page(self, after: str | None, limit: int) -> list[DeadLetter]: ...
    def dead_letters_in(self, part: int, after: str, limit: int) -> list[DeadLetter]: ...
    def delete_dead_letter(self, job_id: str) -> None: ...
    def replay_dead_letter(self, old: Job, new: Job, letter: DeadLetter, now_ms: int) -> None: ...
    def replays(self, job_id: str) -> list[Replay]: ...


class Schedules(Protocol):
    """Recurring schedules' rows, fenced by their version, and their skip counts."""

    def insert_schedule(self, schedule: Schedule) -> bool: ...
    def replace_schedule(self, schedule: Schedule, expected_version: int) -> bool: ...
    def get_schedules(self, schedule_ids: Sequence[str]) -> dict[str, Schedule]: ...
    def list_schedules(self, after: str | None = None, limit: int | None = None) -> list[Schedule]: ...
    def skipped(self, schedule_id: str) -> int: ...


class Flow(Protocol):
    """Flow control: per-kind limits and pauses, and each poller's published demand."""

    def set_limits(self, kind: str, rate_per_s: float | None, burst: int | None,
                   concurrency: int | None, per_key_concurrency: int | None, now_ms: int) -> None: ...
    def set_paused(self, kind: str, paused: bool, now_ms: int) -> None: ...
    def clear_limits(self, kind: str) -> None: ...
    def flow_limits(self) -> list[Limits]: ...
    def publish_demand(self, poller: str, entries: Sequence[DemandEntry], now_ms: int) -> None: ...
    def demands(self, now_ms: int, max_age_ms: int) -> list[Demand]: ...


class Schema(Protocol):
    """Creating or upgrading the schema."""

    def apply_schema(self, options: SchemaOptions, now_ms: int) -> SchemaResult: ...


class Connection(Protocol):
    """The store as a connection: its URL, closing it, calling it from asyncio."""

    @property
    def url(self) -> str: ...
    def close(self) -> None: ...
    async def acall(self, method: str, *args: Any) -> Any: ...


# Every role, for the test that checks the cut covers ``Store``.
ROLES: tuple[type, ...] = (Meta, JobReads, JobWrites, BucketReads, Firing, Ownership, Checkpoints,
                           DeadLetters, Schedules, Flow, Schema, Connection)


# --- intersections the read-only views use (scheduler.observe) ---------------------------

class TimedReads(Meta, BucketReads, Protocol):
    """Buckets by time: the forecast of due jobs."""


class ShardReads(Meta, Checkpoints, BucketReads, Protocol):
    """Buckets against each shard's checkpoint: lag and fleet status."""


class RowReads(Meta, BucketReads, JobReads, Protocol):
    """Bucket rows with their jobs' lookup rows: ``scheduler bucket``, refire."""


class AuditReads(Meta, Checkpoints, BucketReads, JobReads, Protocol):
    """Everything the audit compares: bucket rows, lookup rows, checkpoints."""


class ScheduleReads(JobReads, Schedules, Protocol):
    """Schedules and their occurrences: the broken-chain check."""


class ExporterReads(AuditReads, Schedules, Protocol):
    """The exporter: lag, the audit and the recurring counts."""
