"""The Cassandra store: prepared statements from ``cql/queries.cql``, one ``Cluster``
per store object (one per process; never share it across ``fork()``).

Consistency: LOCAL_QUORUM for job writes and bucket reads by default (a LOCAL_ONE read
that misses a job, followed by a checkpoint advance, would lose it); LOCAL_SERIAL for
lightweight transactions."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from .. import queries
from ..errors import ConfigError, SchedulerError, SchemaError, StoreUnavailable
from ..keys import bucket_of_ms
from ..layout import Layout, Layouts
from ..model import Job, Status
from ..retention import ttl_s
from ..schedule import WRITE_TIME_SLACK_MS
from ..security import CassandraSecurity
from ..settings import cassandra_security
from .base import (
    SCHEMA_VERSION,
    PartRange,
    ProgressFn,
    SchemaOptions,
    SchemaResult,
    Store,
    layouts_of,
    with_fired,
)
from .casync import Batch, CassandraAsync, CqlSteps, Many, Run, dual
from .cbind import FastBinder, bucket_writes
from .cconf import READ_GROUP, CassandraUrl, dt_ms, prepare_failed, replication_map, translate
from .cconnect import connect
from .cfire import BATCH_ROWS, CassandraFiring, host_ms
from .cowner import CassandraOwnership
from .creplays import CassandraReplays
from .cschedules import CassandraSchedules
from .rows import (
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

NOT_IDEMPOTENT = frozenset({"add_skipped"})
# Bucket-row batches stay under Cassandra's default 5 KiB batch warning threshold.
BATCH_BYTES = 4096
# How long schema apply waits, beyond the driver's 10 s, for every node to have a change.
SCHEMA_AGREEMENT_S = 60.0


class CassandraStore(CassandraAsync, CassandraFiring, CassandraOwnership, CassandraReplays,
                     CassandraSchedules, Store):
    def __init__(self, url: str, *, concurrency: int = 128, request_timeout_s: float = 10.0,
                 connect_timeout_s: float = 5.0, security: CassandraSecurity | None = None) -> None:
        """Connect. ``security``: credentials and TLS (default: the settings'). Raises
        ``StoreUnavailable`` when no host answers, ``AuthenticationError`` or ``TlsError``
        (one line naming the setting to fix) when the login or the handshake fails."""
        self.cfg = CassandraUrl(url)
        self.url = url
        self.keyspace = self.cfg.keyspace
        self.concurrency = concurrency
        self._cluster, self.session = connect(
            self.cfg, security if security is not None else cassandra_security(),
            request_timeout_s=request_timeout_s, connect_timeout_s=connect_timeout_s)
        self._prepared: dict[str, Any] = {}
        self._binders: dict[str, FastBinder] = {}
        self._lock = threading.Lock()

    # --- plumbing --------------------------------------------------------------------

    def prepared(self, name: str) -> Any:
        stmt = self._prepared.get(name)
        if stmt is None:
            from cassandra import InvalidRequest

            text = queries.named("queries.cql")[name].replace("{keyspace}", self.keyspace)
            with self._lock:
                try:
                    stmt = self.session.prepare(text)
                except InvalidRequest as exc:
                    raise SchemaError(
                        f"keyspace {self.keyspace!r} is missing or older than this scheduler "
                        f"({exc.summary if hasattr(exc, 'summary') else exc}); "
                        f"run `scheduler schema apply --store {self.url}`"
                    ) from None
                except Exception as exc:
                    # Prepared on first use, which can be in an outage (or just after a
                    # frozen process resumes): a typed error the caller retries.
                    raise prepare_failed(exc, name) from exc
                # Everything but a lightweight transaction or a counter is an upsert or
                # a delete of fixed values: safe to send twice (see cpolicy).
                stmt.is_idempotent = " IF " not in text.upper() and name not in NOT_IDEMPOTENT
                self._prepared[name] = stmt
        return stmt

    def _binder(self, name: str) -> FastBinder:
        binder = self._binders.get(name)
        if binder is None:
            binder = self._binders[name] = FastBinder(self.prepared(name))
        return binder

    def run(self, name: str, params: Sequence[Any] = (), what: str | None = None) -> list[Any]:
        try:
            return list(self.session.execute(self.prepared(name), params))
        except Exception as exc:
            raise translate(exc, what or name) from exc

    # --- schema ----------------------------------------------------------------------

    def apply_schema(self, options: SchemaOptions, now_ms: int) -> SchemaResult:
        """Create or upgrade the schema. A node can report schema agreement and still
        answer INCOMPATIBLE_SCHEMA for a table it has not finished loading (seen on a
        3-node cluster right after it started). Every step here is idempotent, so the
        whole apply runs again, for up to SCHEMA_AGREEMENT_S, before it gives up."""
        deadline = time.monotonic() + SCHEMA_AGREEMENT_S
        while True:
            try:
                return self._apply_schema(options, now_ms)
            except StoreUnavailable as exc:
                if "INCOMPATIBLE_SCHEMA" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def _apply_schema(self, options: SchemaOptions, now_ms: int) -> SchemaResult:
        ddl = {k: v.replace("{keyspace}", self.keyspace)
               .replace("{replication}", replication_map(options.replication))
               for k, v in queries.named("keyspace.cql").items()}
        try:
            self._ddl(ddl["create_keyspace"])
            self._ddl(ddl["create_schema_versions"])
            rows = list(self.session.execute(ddl["select_schema_version"]))
            current = int(rows[0][0]) if rows else 0
            target = options.target_version
            if current > SCHEMA_VERSION:
                raise SchemaError(
                    f"keyspace {self.keyspace!r} has schema v{current}, newer than this scheduler "
                    f"(v{SCHEMA_VERSION}); upgrade the scheduler before applying"
                )
            insert_version = self.session.prepare(ddl["insert_schema_version"])
            for version, desc, text in queries.versions("versions"):
                if version <= current or version > target:
                    continue
                for stmt in queries.statements(text):
                    self._ddl(stmt.replace("{keyspace}", self.keyspace))
                self.session.execute(insert_version, (version, desc, now_ms))
            origin = bucket_of_ms(now_ms, options.bucket_width_s)
            existing = self._read_meta_raw()
            for key, value in meta_items(options, origin):
                if key not in existing:
                    self.run("insert_meta", (key, value))
            changes = retention_changes(options, existing)
            for key, value in changes:
                self.run("update_meta", (key, value))
            if (changes or current < 3) and target >= 3:
                grace = retention_of(self._read_meta_raw()).gc_grace_s
                for table in ("jobs_by_bucket", "jobs"):
                    self._ddl(ddl["set_gc_grace"].replace("{table}", table)
                                  .replace("{seconds}", str(int(grace))))
            if not self.run("select_layouts"):
                self.run("insert_layout", (origin, options.shard_count, now_ms))
        except SchedulerError:
            raise
        except Exception as exc:
            raise translate(exc, "schema apply") from exc
        self.__dict__.pop("_retention", None)
        meta = self.meta()
        if meta.bucket_width_s != options.bucket_width_s:
            raise ConfigError(
                f"keyspace {self.keyspace!r} uses {meta.bucket_width_s}s buckets, fixed at creation; "
                f"drop --bucket-width or pass {meta.bucket_width_s}"
            )
        return SchemaResult(current, max(current, target), current == 0, meta,
                            retention_of(existing) if changes else None)

    def _ddl(self, statement: str) -> None:
        """Run one schema change and return only once every live node has it.

        The driver waits 10 s for agreement and then goes on regardless; a read that
        follows on a loaded multi-node cluster then fails with INCOMPATIBLE_SCHEMA on
        the node that lags. So this waits up to SCHEMA_AGREEMENT_S more, and raises
        StoreUnavailable if the nodes still disagree (nothing after it has run).
        """
        future = self.session.execute_async(statement)
        future.result()
        if future.is_schema_agreed:
            return
        control = self.session.cluster.control_connection
        if not control.wait_for_schema_agreement(wait_time=SCHEMA_AGREEMENT_S):
            raise StoreUnavailable(
                f"the Cassandra nodes did not agree on the schema within {SCHEMA_AGREEMENT_S:.0f} s "
                "after a schema change; check that every node is up (nodetool describecluster) "
                "and run schema apply again")

    def _read_meta_raw(self) -> dict[str, str]:
        return {k: v for k, v in self.run("select_meta")}

    def _read_meta(self) -> dict[str, str]:
        raw = self._read_meta_raw()
        rows = list(self.session.execute(
            queries.named("keyspace.cql")["select_schema_version"].replace("{keyspace}", self.keyspace)))
        raw["schema_version"] = str(rows[0][0]) if rows else "0"
        return raw

    @dual
    def _read_layouts(self) -> CqlSteps[list[Layout]]:
        rows = yield Run("select_layouts")
        froms = [int(f) for f, _, _ in rows]
        marks = {int(f): int(m) for f, m in (yield Run("select_marks", (froms,)))} if froms else {}
        return [Layout(int(f), int(n), dt_ms(c), marks.get(int(f), 0)) for f, n, c in rows]

    @dual
    def layouts(self) -> CqlSteps[Layouts]:
        return layouts_of(self.url, (yield from self._read_layouts.steps(self)))  # type: ignore[attr-defined]

    @dual
    def insert_layout(self, layout: Layout) -> CqlSteps[bool]:
        rows = yield Run("insert_layout", (layout.from_bucket, layout.shard_count, layout.created_ms),
                         "adding a layout")
        return bool(rows[0][0])

    @dual
    def insert_mark(self, from_bucket: int, mark_end: int) -> CqlSteps[None]:
        yield Run("insert_mark", (from_bucket, mark_end), "recording a layout mark")

    def server_now_ms(self) -> int:
        return int(self.run("server_now")[0][0])

    # --- jobs ------------------------------------------------------------------------

    @dual
    def _fired_at(self, jobs: Sequence[Job]) -> CqlSteps[dict[str, int]]:
        stmt = self.prepared("select_fired_at")
        results = yield Many([(stmt, bucket_key(j)) for j in jobs], "reading job status")
        return {job.job_id: dt_ms(rows[0][0]) for job, rows in zip(jobs, results, strict=True)
                if rows and rows[0][0] is not None}

    @dual
    def _job_rows(self, job_ids: Sequence[str]) -> CqlSteps[dict[str, Job]]:
        # Multi-partition IN reads in small groups: one request per READ_GROUP ids
        # instead of one per id (the client's CPU, not the server, limits bulk loads).
        stmt = self.prepared("select_jobs_in")
        groups = [(list(job_ids[i:i + READ_GROUP]),) for i in range(0, len(job_ids), READ_GROUP)]
        out = {}
        for rows in (yield Many([(stmt, g) for g in groups], "reading jobs")):
            for row in rows:
                job = job_from_row(row, dt_ms)
                out[job.job_id] = job
        return out

    @dual
    def get_many(self, job_ids: Sequence[str]) -> CqlSteps[dict[str, Job]]:
        rows = yield from self._job_rows.steps(self, job_ids)  # type: ignore[attr-defined]
        pending = [j for j in rows.values() if j.status is Status.PENDING]
        fired = (yield from self._fired_at.steps(self, pending)) if pending else {}  # type: ignore[attr-defined]
        return with_fired(rows, fired)

    @dual
    def get(self, job_id: str) -> CqlSteps[Job | None]:
        return (yield from self.get_many.steps(self, [job_id])).get(job_id)  # type: ignore[attr-defined,no-any-return]

    def read_bucket(self, bucket: int, shard: int, after: tuple[int, str] | None,
                    until_ms: int, limit: int) -> list[Job]:
        fire_ms, job_id = after if after is not None else (bucket * 1000 - 1, "")
        rows = self.run("select_bucket_rows", (bucket, shard, fire_ms, job_id, until_ms, limit),
                        f"reading bucket {bucket} shard {shard}")
        return jobs_from_bucket_rows(rows, dt_ms)

    @dual
    def read_buckets(self, parts: Sequence[PartRange], limit: int) -> CqlSteps[list[list[Job]]]:
        stmt = self.prepared("select_bucket_rows")
        items = []
        for bucket, shard, after, until_ms in parts:
            fire_ms, job_id = after if after is not None else (bucket * 1000 - 1, "")
            items.append((stmt, (bucket, shard, fire_ms, job_id, until_ms, limit)))
        found = yield Many(items, f"reading {len(items)} bucket ranges")
        return [jobs_from_bucket_rows(rows, dt_ms) for rows in found]

    def pending(self, parts: Sequence[PartRange]) -> list[tuple[int, int | None]]:
        stmt = self.prepared("select_bucket_fired")
        items = []
        for bucket, shard, after, until_ms in parts:
            fire_ms, job_id = after if after is not None else (bucket * 1000 - 1, "")
            items.append((stmt, (bucket, shard, fire_ms, job_id, until_ms)))
        out: list[tuple[int, int | None]] = []
        for rows in self._concurrent(items, "counting due jobs"):
            waiting = [fire_at for fired, fire_at in rows if fired is None]
            out.append((len(waiting), dt_ms(waiting[0]) if waiting else None))
        return out

    @dual
    def insert_many(self, jobs: Sequence[Job], progress: ProgressFn | None = None) -> CqlSteps[None]:
        """See ``Store.insert_many``. Two phases: every bucket row (grouped into
        single-partition unlogged batches, each one atomic mutation), then every lookup
        row. A failure in phase one writes no lookup row."""
        p_bucket, p_job = self.prepared("insert_bucket_row"), self.prepared("insert_job")
        ttls = [self.job_ttl(j) for j in jobs]
        rows = [(j, (*bucket_params(j), t)) for j, t in zip(jobs, ttls, strict=True)]
        writes = bucket_writes(p_bucket, rows, BATCH_BYTES, BATCH_ROWS)
        yield Many(writes, f"writing bucket rows of {len(jobs)} jobs")
        step = 1000
        for i in range(0, len(jobs), step):
            part = zip(jobs[i:i + step], ttls[i:i + step], strict=True)
            yield Many([(p_job, (*job_params(j), t)) for j, t in part], f"writing {len(jobs)} jobs")
            if progress:
                progress(len(jobs[i:i + step]))

    def job_ttl(self, job: Job) -> int:
        """The TTL of a job's rows written before it fires: they end a retention after
        its fire time. Cassandra counts a TTL from its own clock, so this host's clock
        (not a caller's, possibly fake, clock) is the reference."""
        return ttl_s(self.retention.after_fire_ms(job.fire_ms), host_ms())

    def _event_ttl(self) -> int:
        """The TTL of rows retired now (cancel, reschedule): a retention from now."""
        return int(self.retention.jobs_s)

    @dual
    def insert_once(self, jobs: Sequence[Job], written_ms: int) -> CqlSteps[None]:
        """See ``Store.insert_once``: every row written with the fixed write time
        ``written_ms``, so any later change (a firing, a retry, a cancel) wins
        over a rewrite, and a rewrite of an untouched row writes the same values. Never
        later than this host's clock, which the driver dates every other write by (a
        test's fake clock may run ahead of it)."""
        ts = min(written_ms, host_ms() - WRITE_TIME_SLACK_MS) * 1000
        ttls = [self.job_ttl(j) for j in jobs]
        writes = bucket_writes(self.prepared("insert_bucket_row_at"),
                               [(j, (*bucket_params(j), ts, t)) for j, t in zip(jobs, ttls, strict=True)],
                               BATCH_BYTES, BATCH_ROWS)
        yield Many(writes, f"writing bucket rows of {len(jobs)} occurrences")
        p_job = self.prepared("insert_job_at")
        yield Many([(p_job, (*job_params(j), ts, t)) for j, t in zip(jobs, ttls, strict=True)],
                   f"writing {len(jobs)} occurrences")

    def _concurrent(self, items: list[tuple[Any, Any]], what: str) -> list[Any]:
        """Run statements with up to ``concurrency`` in flight; the first error raises."""
        from cassandra.concurrent import execute_concurrent

        if not items:
            return []
        try:
            results = execute_concurrent(self.session, items, concurrency=self.concurrency,
                                         raise_on_first_error=True, results_generator=False)
        except Exception as exc:
            raise translate(exc, what) from exc
        return [list(rows or ()) for _ok, rows in results]

    def _batch_statement(self, items: list[tuple[str, tuple[Any, ...]]]) -> Any:
        from cassandra.query import BatchStatement, BatchType

        batch = BatchStatement(batch_type=BatchType.LOGGED)
        batch.is_idempotent = True  # callers batch upserts and deletes, never an LWT
        for name, params in items:
            batch.add(self.prepared(name), params)
        return batch

    def _batch(self, what: str, items: list[tuple[str, tuple[Any, ...]]]) -> None:
        batch = self._batch_statement(items)
        try:
            self.session.execute(batch)
        except Exception as exc:
            raise translate(exc, what) from exc

    @dual
    def move(self, old: Job, new: Job) -> CqlSteps[None]:
        yield Batch(f"rescheduling job {new.job_id!r}", self._move_rows(old, new))

    @dual
    def move_many(self, pairs: Sequence[tuple[Job, Job]]) -> CqlSteps[None]:
        yield Many([(self._batch_statement(self._move_rows(o, n)), None) for o, n in pairs],
                   f"moving {len(pairs)} jobs")

    def _move_rows(self, old: Job, new: Job) -> list[tuple[str, tuple[Any, ...]]]:
        ttl = self.job_ttl(new)
        if bucket_key(old) == bucket_key(new):
            # Re-armed in place: fired_at goes back to null (one cell tombstone, rare).
            rows = [("insert_bucket_row_full", (*done_bucket_params(new, None), ttl))]
        else:
            rows = [("insert_bucket_row_full", (*done_bucket_params(old, host_ms()), self._event_ttl())),
                    ("insert_bucket_row", (*bucket_params(new), ttl))]
        return [*rows, ("insert_job", (*job_params(new), ttl))]

    @dual
    def cancel(self, job: Job) -> CqlSteps[None]:
        ttl = self._event_ttl()
        yield Batch(f"cancelling job {job.job_id!r}", [
            ("insert_bucket_row_full", (*done_bucket_params(job, host_ms()), ttl)),
            ("insert_job", (*job_params(job.evolve(status=Status.CANCELLED)), ttl)),
        ])

    # --- pollers -----------------------------------------------------------------------

    def _lwt(self, name: str, params: Sequence[Any], what: str) -> tuple[bool, dict[str, Any]]:
        """Run a lightweight transaction; ``(applied, current values when not applied)``.

        A timeout leaves the outcome unknown; callers re-read at SERIAL to learn it.
        """
        try:
            rs = self.session.execute(self.prepared(name), params)
        except Exception as exc:
            raise translate(exc, what) from exc
        row = rs.one()
        values = dict(zip(rs.column_names, row, strict=False))
        return bool(values.pop("[applied]")), values

    def release_version(self) -> str:
        return str(self.run("release_version")[0][0])

    def close(self) -> None:
        self._cluster.shutdown()

