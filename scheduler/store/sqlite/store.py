"""The embedded store: SQLite with the same tables, keys and semantics as Cassandra.

For running the scheduler on one machine with no servers (``scheduler demo``) and for
tests. One connection guarded by a lock; multi-statement operations run in one
transaction, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ...domain.keys import bucket_of_ms, job_hash
from ...domain.layout import Layout
from ...domain.model import Job, Status
from ...domain.progress import Checkpoint
from ...errors import ConfigError, OwnershipLost, SchemaError, StoreUnavailable
from .. import queries
from ..base import (
    DEAD_LETTER_PARTS,
    SCHEMA_VERSION,
    DeadLetter,
    PartRange,
    ProgressFn,
    SchemaOptions,
    SchemaResult,
    ShardCheckpoint,
    Store,
)
from ..rows import (
    bucket_key,
    bucket_params,
    done_bucket_params,
    job_from_row,
    job_params,
    jobs_from_bucket_rows,
    meta_items,
    retention_changes,
    retention_of,
)
from .errors import busy, store_error, sweep_expired
from .fire import SqliteFiring, host_ms
from .flow import SqliteFlow
from .opened import OpenedFile
from .replays import SqliteReplays
from .schedules import SqliteSchedules

# Expired rows are deleted at most this often, by whichever call comes first.
SWEEP_EVERY_S = 1.0
SWEEPS = ("sweep_bucket_rows", "sweep_jobs", "sweep_dead_letters", "sweep_replays")
# How long a nudge address is kept unless written again (the Cassandra table's TTL).
NOTIFY_TTL_MS = 120_000


def _q(name: str) -> str:
    return queries.named("sqlite/queries.sql")[name]


# How long a call waits for another process's hold on the file's lock before it fails
# as StoreUnavailable (sqlite3's busy timeout).
BUSY_TIMEOUT_S = 30.0
# Ids per ``IN (...)`` read: under SQLite's old limit of 999 variables a statement.
ID_CHUNK = 256


class SqliteStore(SqliteFiring, SqliteReplays, SqliteSchedules, SqliteFlow, Store):
    def __init__(self, path: str, url: str | None = None, *, create: bool = True) -> None:
        """Open the database file at ``path``, creating it when ``create`` (``schema
        apply``); without ``create`` a missing file is ``StoreUnavailable`` and no file
        appears (the file is opened read-write, never created: a reader racing a delete
        cannot create it either)."""
        self.url = url or f"sqlite:///{path}"
        self.path = path
        target: str = path
        self._file: OpenedFile | None = None
        if path != ":memory:":
            file = Path(path).expanduser().resolve()
            target = str(file)  # the same file with or without create (~ expanded)
            if not file.parent.is_dir():
                raise StoreUnavailable(
                    f"cannot open {self.url}: folder {file.parent} does not exist; create it or fix --store"
                )
            if not create:
                if not file.is_file():
                    raise StoreUnavailable(
                        f"no store at {self.url}: {file} does not exist (create it with "
                        f"`scheduler schema apply --store {self.url}`, or fix --store)")
                target = file.as_uri() + "?mode=rw"
        try:
            self._db = sqlite3.connect(target, check_same_thread=False, isolation_level=None,
                                       timeout=BUSY_TIMEOUT_S, uri=target.startswith("file:"))
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open {self.url}: {exc}") from None
        if path != ":memory:":
            try:
                self._file = OpenedFile(file)
            except OSError as exc:  # deleted just after the connection opened it
                self._db.close()
                raise StoreUnavailable(f"cannot open {self.url}: {exc.strerror or exc}") from None
        self._lock = threading.RLock()
        self._closed = False
        self._next_sweep = 0.0

    def _check_file(self) -> None:
        """Raise ``StoreUnavailable`` when the store is closed or its file is not at its
        path (``opened.py``). Caller holds the lock."""
        if self._closed:
            raise StoreUnavailable(f"store {self.url} is closed")
        if self._file is not None:
            self._file.check(self.url)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._check_file()
            self._sweep()
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise store_error(self.url, exc) from None
            try:
                yield self._db
            except sqlite3.OperationalError as exc:
                self._rollback()
                raise store_error(self.url, exc) from None
            except BaseException:
                self._rollback()
                raise
            try:
                self._db.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                # A failed COMMIT may leave it open: every later BEGIN would fail.
                self._rollback()
                raise store_error(self.url, exc) from None

    def _rollback(self) -> None:
        """Roll back if still open (SQLite rolls some errors back itself; a ROLLBACK then fails)."""
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            self._check_file()
            self._sweep()
            try:
                return self._db.execute(sql, params).fetchall()
            except sqlite3.OperationalError as exc:
                raise store_error(self.url, exc) from None

    def _sweep(self) -> None:
        """Delete expired rows (the retention; Cassandra uses TTLs), at most once per
        ``SWEEP_EVERY_S``: a row may outlive its expiry by that much. Caller holds the lock."""
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_EVERY_S
        sweep_expired(self._db, [_q(name) for name in SWEEPS], host_ms(), BUSY_TIMEOUT_S)

    # --- schema ------------------------------------------------------------------------

    def _schema_version(self) -> int:
        try:
            row = self._db.execute(_q("select_schema_version")).fetchone()
        except sqlite3.OperationalError as exc:
            if busy(exc):
                raise store_error(self.url, exc) from None
            return 0
        return int(row[0] or 0)

    def apply_schema(self, options: SchemaOptions, now_ms: int) -> SchemaResult:
        with self._tx() as db:
            current = self._schema_version()
            target = options.target_version
            if current > SCHEMA_VERSION:
                raise SchemaError(
                    f"store {self.url} has schema v{current}, newer than this scheduler "
                    f"(v{SCHEMA_VERSION}); upgrade the scheduler"
                )
            for version, desc, text in queries.versions("sqlite"):
                if version <= current or version > target:
                    continue
                for stmt in queries.statements(text):
                    db.execute(stmt)
                db.execute(_q("insert_schema_version"), (version, desc, now_ms))
            created = current == 0
            origin = bucket_of_ms(now_ms, options.bucket_width_s)
            existing = {k: v for k, v in db.execute(_q("select_meta")).fetchall()}
            for key, value in meta_items(options, origin):
                db.execute(_q("insert_meta"), (key, value))
            changes = retention_changes(options, existing)
            for key, value in changes:
                db.execute(_q("update_meta"), (key, value))
            if not db.execute(_q("select_layouts")).fetchall():
                db.execute(_q("insert_layout"), (origin, options.shard_count, now_ms))
        self.__dict__.pop("_retention", None)
        meta = self.meta()
        if meta.bucket_width_s != options.bucket_width_s:
            raise ConfigError(
                f"store {self.url} uses {meta.bucket_width_s}s buckets, fixed at creation; "
                f"drop --bucket-width or pass {meta.bucket_width_s}"
            )
        return SchemaResult(current, max(current, target), created, meta,
                            retention_of(existing) if changes else None)

    def _read_meta(self) -> dict[str, str]:
        raw = {k: v for k, v in self._all(_q("select_meta"))}
        with self._lock:
            raw["schema_version"] = str(self._schema_version())
        return raw

    def _read_layouts(self) -> list[Layout]:
        marks = {int(f): int(m) for f, m in self._all(_q("select_marks"))}
        return [Layout(int(f), int(n), int(c), marks.get(int(f), 0))
                for f, n, c in self._all(_q("select_layouts"))]

    def insert_layout(self, layout: Layout) -> bool:
        with self._tx() as db:
            cur = db.execute(_q("insert_layout"),
                             (layout.from_bucket, layout.shard_count, layout.created_ms))
            return cur.rowcount == 1

    def insert_mark(self, from_bucket: int, mark_end: int) -> None:
        with self._tx() as db:
            db.execute(_q("insert_mark"), (from_bucket, mark_end))

    def server_now_ms(self) -> int:
        import time

        return time.time_ns() // 1_000_000

    # --- jobs --------------------------------------------------------------------------

    def _job_rows(self, job_ids: Sequence[str]) -> dict[str, Job]:
        out: dict[str, Job] = {}  # one read per ID_CHUNK ids, not one per id
        ids = list(dict.fromkeys(job_ids))
        for i in range(0, len(ids), ID_CHUNK):
            chunk = ids[i:i + ID_CHUNK]
            # Padded with its last id to one of 4 lengths: 4 statements in sqlite3's cache.
            size = next(n for n in (1, 16, 64, ID_CHUNK) if n >= len(chunk))
            chunk += chunk[-1:] * (size - len(chunk))
            for row in self._all(_q("select_jobs_in").format(marks=",".join("?" * size)), chunk):
                job = job_from_row(row)
                out[job.job_id] = job
        return out

    def lookup_positions(self, first_bucket: int, last_bucket: int) -> Iterator[tuple[str, int, int, int]]:
        for job_id, bucket, shard, fire in self._all(_q("select_job_positions"), (first_bucket, last_bucket)):
            yield job_id, int(bucket), int(shard), int(fire)

    def _fired_at(self, jobs: Sequence[Job]) -> dict[str, int]:
        out: dict[str, int] = {}
        for job in jobs:
            rows = self._all(_q("select_fired_at"), bucket_key(job))
            if rows and rows[0][0] is not None:
                out[job.job_id] = int(rows[0][0])
        return out

    def read_bucket(self, bucket: int, shard: int, after: tuple[int, str] | None,
                    until_ms: int, limit: int) -> list[Job]:
        fire_ms, job_id = after if after is not None else (bucket * 1000 - 1, "")
        rows = self._all(_q("select_bucket_rows"), (bucket, shard, fire_ms, job_id, until_ms, limit))
        return jobs_from_bucket_rows(rows)

    def pending(self, parts: Sequence[PartRange]) -> list[tuple[int, int | None]]:
        out: list[tuple[int, int | None]] = []
        for bucket, shard, after, until_ms in parts:
            fire_ms, job_id = after if after is not None else (bucket * 1000 - 1, "")
            rows = self._all(_q("count_bucket_pending"), (bucket, shard, fire_ms, job_id, until_ms))
            out.append((int(rows[0][0]), None if rows[0][1] is None else int(rows[0][1])))
        return out

    def insert_many(self, jobs: Sequence[Job], progress: ProgressFn | None = None) -> None:
        # One transaction per chunk: all-or-nothing per chunk, and fast.
        chunk = 500
        for i in range(0, len(jobs), chunk):
            part = jobs[i:i + chunk]
            expiry = [self.retention.after_fire_ms(j.fire_ms) for j in part]
            with self._tx() as db:
                db.executemany(_q("insert_bucket_row"),
                               [(*bucket_params(j), e) for j, e in zip(part, expiry, strict=True)])
                db.executemany(_q("insert_job"),
                               [(*job_params(j), e) for j, e in zip(part, expiry, strict=True)])
            if progress:
                progress(len(part))

    def insert_once(self, jobs: Sequence[Job], written_ms: int) -> None:
        # The lookup row decides: a cancelled occurrence has no bucket row left, and
        # must not get one back.
        with self._tx() as db:
            for job in jobs:
                expiry = self.retention.after_fire_ms(job.fire_ms)
                if db.execute(_q("insert_job_once"), (*job_params(job), expiry)).rowcount:
                    db.execute(_q("insert_bucket_row"), (*bucket_params(job), expiry))

    def move(self, old: Job, new: Job) -> None:
        with self._tx() as db:
            self._move_in(db, old, new)

    def cancel(self, job: Job) -> None:
        now = host_ms()
        expiry = self.retention.after_event_ms(now)
        with self._tx() as db:
            db.execute(_q("insert_bucket_row_full"), (*done_bucket_params(job, now), expiry))
            db.execute(_q("insert_job"), (*job_params(job.evolve(status=Status.CANCELLED)), expiry))

    # --- pollers -----------------------------------------------------------------------

    def claim_shard(self, shard: int, owner: str, epoch: int, initial_drained: int,
                    now_ms: int, *, global_fence: bool = False) -> Checkpoint:
        with self._tx() as db:
            db.execute(_q("create_checkpoint"), (shard, initial_drained, owner, epoch, now_ms))
            db.execute(_q("claim_checkpoint"), (owner, epoch, now_ms, shard, epoch))
            return self._held(db, shard, owner, epoch)

    def take_released_shard(self, shard: int, owner: str, epoch: int, seen_epoch: int, now_ms: int,
                            *, global_fence: bool = False) -> Checkpoint:
        with self._tx() as db:
            db.execute(_q("take_released_checkpoint"), (owner, epoch, now_ms, shard, seen_epoch))
            return self._held(db, shard, owner, epoch)

    @staticmethod
    def _held(db: sqlite3.Connection, shard: int, owner: str, epoch: int) -> Checkpoint:
        row = db.execute(_q("select_checkpoint"), (shard,)).fetchone()
        if row is None:
            raise OwnershipLost(f"shard {shard}: no checkpoint row")
        bucket, fire, job_id, holder, held_epoch = row
        if held_epoch != epoch or holder != owner:
            raise OwnershipLost(f"shard {shard} is held by {holder} with epoch {held_epoch}",
                                holder=holder, held_epoch=int(held_epoch))
        return Checkpoint(int(bucket), None if fire is None else (int(fire), job_id))

    def save_checkpoint(self, shard: int, epoch: int, checkpoint: Checkpoint, now_ms: int) -> None:
        fire, job_id = checkpoint.done_cursor or (None, None)
        with self._tx() as db:
            cur = db.execute(_q("save_checkpoint"), (checkpoint.drained, fire, job_id, now_ms, shard,
                                                     epoch, checkpoint.drained))
            if cur.rowcount == 1:
                return
            row = db.execute(_q("select_checkpoint"), (shard,)).fetchone()
        if row is None or row[4] != epoch:
            raise OwnershipLost(f"shard {shard}: checkpoint refused, epoch {epoch} no longer owns it")

    def release_shard(self, shard: int, epoch: int, now_ms: int) -> bool:
        with self._tx() as db:
            return db.execute(_q("release_checkpoint"), (now_ms, shard, epoch)).rowcount > 0

    def checkpoints(self) -> list[ShardCheckpoint]:
        return [ShardCheckpoint(int(sh), int(b), None if f is None else (int(f), j), o, int(e), u)
                for sh, b, f, j, o, e, u in self._all(_q("select_checkpoints"))]

    def set_notify_endpoint(self, owner: str, address: str | None, now_ms: int) -> None:
        with self._tx() as db:
            if address is None:
                db.execute(_q("delete_notify_endpoint"), (owner,))
            else:
                db.execute(_q("upsert_notify_endpoint"), (owner, address, now_ms + NOTIFY_TTL_MS))

    def notify_endpoints(self, now_ms: int) -> dict[str, str]:
        return {o: a for o, a in self._all(_q("select_notify_endpoints"), (now_ms,))}

    def dead_letters(self) -> list[DeadLetter]:
        out: list[DeadLetter] = []
        for part in range(DEAD_LETTER_PARTS):
            out.extend(DeadLetter(j, k, int(d), int(a), e, int(t))
                       for j, k, d, a, e, t in self._all(_q("select_dead_letters"), (part,)))
        return out

    def dead_letters_in(self, part: int, after: str, limit: int) -> list[DeadLetter]:
        return [DeadLetter(j, k, int(d), int(a), e, int(t))
                for j, k, d, a, e, t in self._all(_q("select_dead_letters_after"), (part, after, limit))]

    def delete_dead_letter(self, job_id: str) -> None:
        with self._tx() as db:
            db.execute(_q("delete_dead_letter"), (job_hash(job_id) % DEAD_LETTER_PARTS, job_id))

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()
