"""The storage interface: one abstract class, a Cassandra and an embedded
implementation, and one contract test suite (``tests/contract``) run against both.
Consumers see it by role: ``roles.py`` cuts its public methods into small protocols
(``Meta``, ``JobReads``, ``Firing``...), and each consumer is annotated with the ones
it calls; ``Store`` satisfies all of them.

Every method either does all of its work or raises a ``SchedulerError``; the docstring
of each says what a failure part-way leaves behind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..domain.keys import DEFAULT_BUCKET_WIDTH_S, DEFAULT_SHARD_COUNT, job_hash
from ..domain.layout import Layout, Layouts
from ..domain.model import Job, Status
from ..domain.progress import Checkpoint, Key
from ..domain.retention import DEFAULT_DEAD_RETENTION_S, DEFAULT_RETENTION_S, Retention
from ..errors import SchemaError
from .flow import FlowTables
from .history import Replay
from .schedules import ScheduleRows

SCHEMA_VERSION = 11

# A producer pushes a job's fire time to at least now + late margin, so it lands
# ahead of any poller's read cursor: a poller reads at most late_margin - 2 * max_skew
# (2 s) ahead of its clock and refuses to fire with more clock skew than max_skew.
# Reading two poll intervals ahead keeps firing precise even when a poll runs long.
DEFAULT_LATE_MARGIN_MS = 3_000
DEFAULT_MAX_SKEW_MS = 500


@dataclass(frozen=True)
class StoreMeta:
    """Keyspace-wide settings, fixed at creation; producers and pollers must agree."""

    schema_version: int
    bucket_width_s: int
    late_margin_ms: int
    max_skew_ms: int
    # Buckets before this one never held jobs: a shard without a checkpoint starts here.
    origin_bucket: int
    # How long rows are kept (the only settings that can change after creation; see
    # scheduler.domain.retention). A keyspace older than v003 has none: the defaults.
    retention_s: int = DEFAULT_RETENTION_S
    dead_retention_s: int = DEFAULT_DEAD_RETENTION_S

    @property
    def retention(self) -> Retention:
        return Retention(self.retention_s, self.dead_retention_s)


@dataclass(frozen=True)
class SchemaOptions:
    shard_count: int = DEFAULT_SHARD_COUNT
    bucket_width_s: int = DEFAULT_BUCKET_WIDTH_S
    late_margin_ms: int = DEFAULT_LATE_MARGIN_MS
    max_skew_ms: int = DEFAULT_MAX_SKEW_MS
    # Cassandra only: "simple:1" or "nts:dc1=3,dc2=3".
    replication: str = "simple:1"
    # None keeps the keyspace's value (the default for a new keyspace); a value changes it.
    retention_s: int | None = None
    dead_retention_s: int | None = None
    # Stop at this schema version (tests of upgrades); None: the latest.
    upto: int | None = None

    @property
    def target_version(self) -> int:
        return SCHEMA_VERSION if self.upto is None else min(self.upto, SCHEMA_VERSION)


@dataclass(frozen=True)
class SchemaResult:
    from_version: int
    to_version: int
    created: bool
    meta: StoreMeta
    # The retention settings before this apply, when it changed them (else None).
    retention_was: Retention | None = None


ProgressFn = Callable[[int], None]
# (bucket, shard, after, until_ms): a key range of one partition, for counting.
PartRange = tuple[int, int, Key | None, int]
DEAD_LETTER_PARTS = 16


@dataclass(frozen=True)
class ShardCheckpoint:
    """A shard's persisted checkpoint and current owner, for views and exporters."""

    shard: int
    drained: int
    done_cursor: Key | None
    owner: str | None
    owner_epoch: int
    updated_ms: int | None


@dataclass(frozen=True)
class DeadLetter:
    job_id: str
    kind: str
    due_ms: int
    attempts: int
    error: str | None
    died_ms: int


def layouts_of(url: str, found: list[Layout]) -> Layouts:
    if not found:
        raise SchemaError(f"store {url} has no shard layout; run `scheduler schema apply`")
    return Layouts(found)


def with_fired(rows: dict[str, Job], fired: dict[str, int]) -> dict[str, Job]:
    """Lookup rows with the firings recorded in their bucket rows applied."""
    for job_id, fired_ms in fired.items():
        job = rows[job_id]
        rows[job_id] = job.evolve(status=Status.FIRED, fired_ms=fired_ms, attempts=job.attempts + 1)
    return rows


class Store(ScheduleRows, FlowTables, ABC):
    """What the library needs from a store (the recurring schedules' rows: see
    ``ScheduleRows``; flow control's limits and demand: see ``FlowTables``).
    Implementations are thread-safe."""

    url: str

    # --- schema and keyspace settings -------------------------------------------------

    async def acall(self, method: str, *args: Any) -> Any:
        """``method(*args)`` for ``AsyncClient``. The embedded store runs it inline, on the
        event loop: each call is one local SQLite transaction (no network to wait for);
        Cassandra overrides this with the driver's futures."""
        return getattr(self, method)(*args)

    @abstractmethod
    def apply_schema(self, options: SchemaOptions, now_ms: int) -> SchemaResult:
        """Create or upgrade the schema; idempotent. Refuses a schema newer than this code."""

    @abstractmethod
    def _read_meta(self) -> dict[str, str]:
        """Raw keyspace settings; raises ``SchemaError`` when the schema is missing."""

    @abstractmethod
    def _read_layouts(self) -> list[Layout]:
        """Every layout, marks included."""

    @abstractmethod
    def insert_layout(self, layout: Layout) -> bool:
        """Add a layout unless one starts at the same bucket; True when added."""

    @abstractmethod
    def insert_mark(self, from_bucket: int, mark_end: int) -> None:
        """Record that writers reached buckets before ``mark_end`` under a layout."""

    @abstractmethod
    def server_now_ms(self) -> int:
        """The store's own wall clock, for skew checks."""

    def peers_down(self) -> int:
        """How many nodes of other DCs than this process's own are down now, as the
        store's client last heard (no I/O). 0 for a store without DCs."""
        return 0

    def meta(self) -> StoreMeta:
        raw = self._read_meta()
        try:
            return StoreMeta(
                schema_version=int(raw["schema_version"]),
                bucket_width_s=int(raw["bucket_width_s"]),
                late_margin_ms=int(raw["late_margin_ms"]),
                max_skew_ms=int(raw["max_skew_ms"]),
                origin_bucket=int(raw["origin_bucket"]),
                retention_s=int(raw.get("retention_s", DEFAULT_RETENTION_S)),
                dead_retention_s=int(raw.get("dead_retention_s", DEFAULT_DEAD_RETENTION_S)),
            )
        except KeyError as exc:
            raise SchemaError(
                f"store {self.url} has no setting {exc.args[0]}; run `scheduler schema apply`"
            ) from None

    @property
    def retention(self) -> Retention:
        """The keyspace's retention, read once per store object: a change reaches a
        process when it next opens the store (``schema apply`` says so)."""
        cached: Retention | None = self.__dict__.get("_retention")
        if cached is None:
            cached = self.__dict__["_retention"] = self.meta().retention
        return cached

    def layouts(self) -> Layouts:
        return layouts_of(self.url, self._read_layouts())

    # --- jobs ------------------------------------------------------------------------------

    @abstractmethod
    def _job_rows(self, job_ids: Sequence[str]) -> dict[str, Job]:
        """Lookup rows of the jobs that exist among ``job_ids``, as stored."""

    @abstractmethod
    def _fired_at(self, jobs: Sequence[Job]) -> dict[str, int]:
        """When these jobs' bucket rows fired, for those that did: their ``fired_at``, or
        (Cassandra) the time of a batch of firings that lists them."""

    def get(self, job_id: str) -> Job | None:
        """The job with its derived status, or None."""
        return self.get_many([job_id]).get(job_id)

    def lookup_rows(self, job_ids: Sequence[str]) -> dict[str, Job]:
        """The lookup rows among ``job_ids`` as stored: a pending one is not checked
        against its bucket row (``get_many`` does that), for callers that hold the bucket
        rows already (the audit). Cassandra: one concurrent read per 64 ids."""
        return self._job_rows(job_ids)

    @abstractmethod
    def lookup_positions(self, first_bucket: int, last_bucket: int) -> Iterator[tuple[str, int, int, int]]:
        """``(job_id, bucket, shard, fire_ms)`` of every lookup row whose position is in
        the bucket range, streamed. Cassandra reads the whole lookup table for it (no
        index serves a bucket range): the audit's opt-in ``--lookups`` scan, nothing else."""

    def get_many(self, job_ids: Sequence[str]) -> dict[str, Job]:
        """The jobs that exist among ``job_ids``, with their status.

        A pending lookup row whose bucket row has been fired is reported fired: the
        poller records firings in the bucket partition, not per job id.
        """
        rows = self._job_rows(job_ids)
        pending = [j for j in rows.values() if j.status is Status.PENDING]
        return with_fired(rows, self._fired_at(pending) if pending else {})

    @abstractmethod
    def read_bucket(self, bucket: int, shard: int, after: tuple[int, str] | None,
                    until_ms: int, limit: int) -> list[Job]:
        """Rows of one partition in ``(fire_ms, job_id)`` order, strictly after the cursor
        ``after`` (None: from the start) and with ``fire_ms <= until_ms``. Fired rows and
        rows retired by a cancel or a move are included, with ``fired_at`` set, until
        their retention passes."""

    def read_buckets(self, parts: Sequence[PartRange], limit: int) -> list[list[Job]]:
        """``read_bucket`` for each ``(bucket, shard, after, until_ms)``, up to ``limit``
        rows each, in order. A store that can overlaps the reads (Cassandra does); the
        first error raises and no result is returned."""
        return [self.read_bucket(b, s, after, until, limit) for b, s, after, until in parts]

    def count_pending(self, parts: Sequence[PartRange]) -> list[int]:
        """For each ``(bucket, shard, after, until_ms)``: how many rows of that partition,
        strictly after the key ``after`` (None: from the start) and with ``fire_ms <=
        until_ms``, are not fired yet. Read-only; many partitions are read at once."""
        return [n for n, _ in self.pending(parts)]

    @abstractmethod
    def pending(self, parts: Sequence[PartRange]) -> list[tuple[int, int | None]]:
        """``count_pending``'s count for each part, with the ``fire_ms`` of the oldest of
        those rows (None when there is none)."""

    @abstractmethod
    def insert_many(self, jobs: Sequence[Job], progress: ProgressFn | None = None) -> None:
        """Write new jobs, many in flight.

        Each job's bucket row is written before its lookup row, so a lookup row that
        exists always has its bucket row: an interrupted call leaves some jobs fully
        written and others invisible, and re-running it is safe. Raises the first
        error after every job was attempted.
        """

    @abstractmethod
    def insert_once(self, jobs: Sequence[Job], written_ms: int) -> None:
        """Write jobs that every writer places identically (recurring occurrences, whose
        id, kind, payload and position derive from their schedule), leaving any that
        exists as it is: a rewrite never undoes a firing, a retry or a cancel.
        ``written_ms`` must be earlier than any change made to these jobs after their
        first write (Cassandra writes the rows with it as their write time: any later
        change wins). Bucket rows first, as ``insert_many``; the first error raises."""

    @abstractmethod
    def move(self, old: Job, new: Job) -> None:
        """Retire ``old``'s bucket row (marked done, expiring a retention from now; no
        tombstone) and write ``new``'s rows, atomically (a logged batch in Cassandra, a
        transaction in SQLite). When both sit at the same key, the row is re-armed."""

    def move_many(self, pairs: Sequence[tuple[Job, Job]]) -> None:
        """``move`` for each ``(old, new)`` pair, many in flight (each pair atomic on its
        own). Raises the first error; pairs already applied stay applied, and calling
        again with the same pairs is safe."""
        for old, new in pairs:
            self.move(old, new)

    @abstractmethod
    def cancel(self, job: Job) -> None:
        """Retire the job's bucket row (marked done, so a poller skips it: no tombstone in
        an open bucket) and mark it cancelled, atomically; both rows expire a retention
        from now."""

    # --- pollers ---------------------------------------------------------------------

    @abstractmethod
    def claim_shard(self, shard: int, owner: str, epoch: int, initial_drained: int,
                    now_ms: int, *, global_fence: bool = False) -> Checkpoint:
        """Take ownership of ``shard`` with fencing token ``epoch`` and return its checkpoint
        (creating it at ``initial_drained`` when absent). Raises ``OwnershipLost`` when a
        holder with a larger epoch exists. Re-claiming with the same epoch is a no-op.
        ``global_fence``: fence against owners in every DC, not only the store's own
        (Cassandra: SERIAL instead of LOCAL_SERIAL; a store with one copy ignores it)."""

    @abstractmethod
    def take_released_shard(self, shard: int, owner: str, epoch: int, seen_epoch: int, now_ms: int,
                            *, global_fence: bool = False) -> Checkpoint:
        """Take ``shard`` at ``epoch`` (lower than its stored one) if it is still released
        (no owner) at ``seen_epoch``; its checkpoint. Raises ``OwnershipLost`` otherwise."""

    @abstractmethod
    def save_checkpoint(self, shard: int, epoch: int, checkpoint: Checkpoint, now_ms: int) -> None:
        """Persist a checkpoint if ``epoch`` still owns the shard; it never moves backwards.
        Raises ``OwnershipLost`` when another owner took over (nothing is written)."""

    @abstractmethod
    def release_shard(self, shard: int, epoch: int, now_ms: int) -> bool:
        """Clear the owner if ``epoch`` still owns the shard (idempotent). False when
        the fence refused it: another owner holds the shard with a newer epoch."""

    @abstractmethod
    def checkpoints(self) -> list[ShardCheckpoint]:
        """Every shard's checkpoint row."""

    @abstractmethod
    def set_notify_endpoint(self, owner: str, address: str | None, now_ms: int) -> None:
        """Record where poller ``owner`` listens for nudges (kept 120 s unless written
        again), or remove it (``address`` None)."""

    @abstractmethod
    def notify_endpoints(self, now_ms: int) -> dict[str, str]:
        """Every live poller's nudge address, by poller name."""

    @abstractmethod
    def record_fired(self, jobs: Sequence[Job], fired_ms: int) -> None:
        """Record the jobs' bucket rows as fired at ``fired_ms``: ``fired_at`` on each row
        (embedded store), or rows of ``fired_batches`` listing them (Cassandra), a few writes
        per partition either way. A new owner re-reading those rows skips them; a lost write
        means at most a duplicate."""

    @abstractmethod
    def record_retry(self, old: Job, new: Job, error: str, now_ms: int) -> None:
        """Mark ``old``'s row fired, write the retry's bucket row and point the lookup row
        at it, atomically."""

    @abstractmethod
    def record_dead(self, job: Job, error: str, now_ms: int) -> None:
        """Mark the row fired, the job dead, and add it to the dead letters, atomically."""

    @abstractmethod
    def dead_letters(self) -> list[DeadLetter]:
        """Every dead letter."""

    def dead_letter_page(self, after: str | None, limit: int) -> list[DeadLetter]:
        """Up to ``limit`` dead letters in (part, job id) order, strictly after the dead
        letter ``after`` (None: from the first). One bounded read per part visited."""
        part, last = (job_hash(after) % DEAD_LETTER_PARTS, after) if after is not None else (0, "")
        out: list[DeadLetter] = []
        while part < DEAD_LETTER_PARTS and len(out) < limit:
            out.extend(self.dead_letters_in(part, last, limit - len(out)))
            part, last = part + 1, ""
        return out

    @abstractmethod
    def dead_letters_in(self, part: int, after: str, limit: int) -> list[DeadLetter]:
        """Up to ``limit`` dead letters of one part, by job id, after ``after``."""

    @abstractmethod
    def delete_dead_letter(self, job_id: str) -> None:
        """Remove a dead letter (after a replay)."""

    @abstractmethod
    def replay_dead_letter(self, old: Job, new: Job, letter: DeadLetter, now_ms: int) -> None:
        """``move(old, new)``, remove the dead letter and record the replay, atomically.
        A store older than v005 raises ``SchemaError`` and writes nothing."""

    @abstractmethod
    def replays(self, job_id: str) -> list[Replay]:
        """The job's replays (``store.history``), newest first, at most 100."""

    @abstractmethod
    def close(self) -> None:
        """Release connections; idempotent."""
