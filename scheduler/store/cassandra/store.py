"""The Cassandra store: prepared statements from ``cql/queries.cql``, one ``Cluster``
per store object (one per process; never share it across ``fork()``).

Consistency: LOCAL_QUORUM for job writes and bucket reads by default (a LOCAL_ONE read
that misses a job, followed by a checkpoint advance, would lose it); a producer may write
at EACH_QUORUM, its reads staying at LOCAL_QUORUM. Lightweight transactions: LOCAL_SERIAL
when the store is given a DC (its pollers fence each other within that DC), SERIAL
otherwise (see docs/two-data-centres.md)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from ...domain.model import Job, Status
from ...domain.retention import ttl_s
from ...errors import SchemaError
from ...recurring.schedule import WRITE_TIME_SLACK_MS
from ...security import CassandraSecurity
from .. import queries
from ..base import (
    PartRange,
    ProgressFn,
    Store,
    with_fired,
)
from ..rows import bucket_key, derive_fired, fired_keys, job_from_row, jobs_from_bucket_rows
from .bind import bucket_params, bucket_writes, done_bucket_params, job_params
from .conf import READ_GROUP, CassandraUrl, dt_ms, prepare_failed, translate
from .connect import connect
from .fire import BATCH_ROWS, FIRED_BATCH_SPAN_MS, CassandraFiring, host_ms
from .flow import CassandraFlow
from .owner import CassandraOwnership
from .replays import CassandraReplays
from .run import Batch, CassandraAsync, CqlSteps, Many, dual
from .schedules import CassandraSchedules
from .schema import CassandraSchema

NOT_IDEMPOTENT = frozenset({"add_skipped"})
# Bucket-row batches stay under Cassandra's default 5 KiB batch warning threshold.
BATCH_BYTES = 4096


class CassandraStore(CassandraAsync, CassandraSchema, CassandraFiring, CassandraOwnership,
                     CassandraReplays, CassandraSchedules, CassandraFlow, Store):
    def __init__(self, url: str, *, concurrency: int = 128, request_timeout_s: float = 10.0,
                 connect_timeout_s: float = 5.0, security: CassandraSecurity | None = None,
                 dc: str | None = None, consistency: str | None = None) -> None:
        """Connect. ``security``: credentials and TLS, as the caller read them (default: none;
        the store reads no environment). ``dc``: the client's DC (one setting with the
        URL's ``local_dc``); ``consistency``: ``local_quorum`` or ``each_quorum`` for
        writes (see ``CassandraUrl``). Raises ``ConfigError`` for a bad or conflicting
        setting, or a DC the cluster does not have;
        ``StoreUnavailable`` when no host answers, ``AuthenticationError`` or ``TlsError``
        (one line naming the setting to fix) when the login or the handshake fails."""
        self.cfg = CassandraUrl(url, dc=dc, consistency=consistency)
        self.url = url
        self.keyspace = self.cfg.keyspace
        self.concurrency = concurrency
        self._cluster, self.session = connect(
            self.cfg, security if security is not None else CassandraSecurity(),
            request_timeout_s=request_timeout_s, connect_timeout_s=connect_timeout_s)
        self._prepared: dict[str, Any] = {}
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
                # a delete of fixed values: safe to send twice (see policy.py).
                lwt = " IF " in text.upper()
                stmt.is_idempotent = not lwt and name not in NOT_IDEMPOTENT
                self._set_levels(stmt, text, lwt)
                self._prepared[name] = stmt
        return stmt

    def _set_levels(self, stmt: Any, text: str, lwt: bool) -> None:
        """Reads and lightweight transactions at their own levels (a bound statement takes
        its prepared statement's); other writes, and every batch (which holds only
        writes), take the session's default: the write level."""
        from cassandra import ConsistencyLevel

        if lwt:
            # The fencing level, and the commit at the read level: a poller's transaction
            # never waits on another DC when the store has one (LOCAL_SERIAL).
            stmt.serial_consistency_level = ConsistencyLevel.name_to_value[self.cfg.serial_cl]
            stmt.consistency_level = ConsistencyLevel.name_to_value[self.cfg.read_cl]
        elif text.lstrip().upper().startswith("SELECT"):
            stmt.consistency_level = ConsistencyLevel.name_to_value[self.cfg.read_cl]

    def run(self, name: str, params: Sequence[Any] = (), what: str | None = None) -> list[Any]:
        try:
            return list(self.session.execute(self.prepared(name), params))
        except Exception as exc:
            raise translate(exc, what or name) from exc

    # --- jobs ------------------------------------------------------------------------

    @dual
    def _fired_at(self, jobs: Sequence[Job]) -> CqlSteps[dict[str, int]]:
        stmt = self.prepared("select_fired_at")
        results = yield Many([(stmt, bucket_key(j)) for j in jobs], "reading job status")
        out = {job.job_id: dt_ms(rows[0][0]) for job, rows in zip(jobs, results, strict=True)
               if rows and rows[0][0] is not None}
        # A row with no fired_at may be listed by a batch of firings (one read each).
        unmarked = [j for j, rows in zip(jobs, results, strict=True) if rows and j.job_id not in out]
        if unmarked:
            found = yield Many([self._listings(j.bucket, j.shard, (j.fire_ms, j.job_id), j.fire_ms)
                                for j in unmarked], "reading job status")
            for j, rows in zip(unmarked, found, strict=True):
                key = (j.fire_ms, j.job_id)
                if (at := fired_keys(rows, key).get(key)) is not None:
                    out[j.job_id] = at
        return out

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

    def _listings(self, bucket: int, shard: int, first: tuple[int, str], last_ms: int) -> tuple[Any, Any]:
        """The read of the batches of firings that can list a row of the partition from the
        key ``first`` to the fire time ``last_ms`` (those ending in that range, or at most a
        batch's span after it)."""
        return (self.prepared("select_fired_batches_from"),
                (bucket, shard, *first, last_ms + FIRED_BATCH_SPAN_MS))

    def read_bucket(self, bucket: int, shard: int, after: tuple[int, str] | None,
                    until_ms: int, limit: int) -> list[Job]:
        return self.read_buckets([(bucket, shard, after, until_ms)], limit)[0]

    @dual
    def read_buckets(self, parts: Sequence[PartRange], limit: int) -> CqlSteps[list[list[Job]]]:
        """Each range's rows, then, for the ranges holding rows with no ``fired_at``, the
        batches of firings that can list them (a second round, only then: a poll of rows
        already fired, or of none, costs one read)."""
        stmt = self.prepared("select_bucket_rows")
        items = []
        for bucket, shard, after, until_ms in parts:
            fire_ms, job_id = after if after is not None else (bucket * 1000 - 1, "")
            items.append((stmt, (bucket, shard, fire_ms, job_id, until_ms, limit)))
        what = f"reading bucket {parts[0][0]} shard {parts[0][1]}" if len(parts) == 1 else (
            f"reading {len(parts)} bucket ranges")
        out = [jobs_from_bucket_rows(rows, dt_ms) for rows in (yield Many(items, what))]
        todo = [(i, first) for i, jobs in enumerate(out)
                if (first := next((j for j in jobs if j.fired_ms is None), None)) is not None]
        if todo:
            found = yield Many([self._listings(first.bucket, first.shard, (first.fire_ms, first.job_id),
                                               out[i][-1].fire_ms) for i, first in todo], what)
            for (i, _), rows in zip(todo, found, strict=True):
                if rows:
                    last = out[i][-1]
                    out[i] = derive_fired(out[i], fired_keys(rows, (last.fire_ms, last.job_id)))
        return out

    def pending(self, parts: Sequence[PartRange]) -> list[tuple[int, int | None]]:
        """Rows with no ``fired_at`` that no batch of firings lists: the rows first, then
        the batches from the first such row of each range on (as ``read_buckets``)."""
        stmt = self.prepared("select_bucket_fired")
        items = []
        for bucket, shard, after, until_ms in parts:
            fire_ms, job_id = after if after is not None else (bucket * 1000 - 1, "")
            items.append((stmt, (bucket, shard, fire_ms, job_id, until_ms)))
        found = self._concurrent(items, "counting due jobs")
        waiting = [[(int(f), j) for fired, f, j in rows if fired is None] for rows in found]
        todo = [i for i, keys in enumerate(waiting) if keys]
        if todo:
            reads = [self._listings(parts[i][0], parts[i][1], waiting[i][0], waiting[i][-1][0]) for i in todo]
            listed = self._concurrent(reads, "counting due jobs")
            for i, rows in zip(todo, listed, strict=True):
                if rows:
                    fired = fired_keys(rows, waiting[i][-1])
                    waiting[i] = [k for k in waiting[i] if k not in fired]
        return [(len(keys), keys[0][0] if keys else None) for keys in waiting]

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
            if len(items) == 1:  # one statement: no concurrency machinery (the reader's poll)
                return [list(self.session.execute(*items[0]) or ())]
            results = execute_concurrent(self.session, items, concurrency=self.concurrency,
                                         raise_on_first_error=True, results_generator=False)
            # Inside the try: a result past its first page fetches the next one here.
            return [list(rows or ()) for _ok, rows in results]
        except Exception as exc:
            raise translate(exc, what) from exc

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
        # The new row's fired_at is written null (one cell tombstone a move): the job may
        # have sat at that position before (moved away and back), and the retired row's
        # fired_at would otherwise make it read as fired, never to fire.
        rows = [("insert_bucket_row_full", (*done_bucket_params(new, None), ttl))]
        if bucket_key(old) != bucket_key(new):
            retired = done_bucket_params(old, host_ms())
            rows.insert(0, ("insert_bucket_row_full", (*retired, self._event_ttl())))
        return [*rows, ("insert_job", (*job_params(new), ttl))]

    @dual
    def cancel(self, job: Job) -> CqlSteps[None]:
        ttl = self._event_ttl()
        yield Batch(f"cancelling job {job.job_id!r}", [
            ("insert_bucket_row_full", (*done_bucket_params(job, host_ms()), ttl)),
            ("insert_job", (*job_params(job.evolve(status=Status.CANCELLED)), ttl)),
        ])

    # --- pollers -----------------------------------------------------------------------

    def _lwt(self, name: str, params: Sequence[Any], what: str,
             serial: str | None = None) -> tuple[bool, dict[str, Any]]:
        """Run a lightweight transaction; ``(applied, current values when not applied)``.
        ``serial``: a serial consistency other than the session's (``SERIAL``).

        A timeout leaves the outcome unknown; callers re-read at SERIAL to learn it.
        """
        from cassandra import ConsistencyLevel

        stmt = self.prepared(name)
        args: Sequence[Any] | None = params
        if serial is not None:
            stmt, args = stmt.bind(params), None
            stmt.serial_consistency_level = ConsistencyLevel.name_to_value[serial]
        try:
            rs = self.session.execute(stmt, args)
        except Exception as exc:
            raise translate(exc, what) from exc
        row = rs.one()
        values = dict(zip(rs.column_names, row, strict=False))
        return bool(values.pop("[applied]")), values

    def peers_down(self) -> int:
        """Nodes of other DCs that the driver holds down (Cassandra's status events, sent
        when its failure detector convicts a node, and its "up" events when they return);
        0 for a store given no DC. No I/O."""
        if self.cfg.dc is None:
            return 0
        return sum(1 for h in self._cluster.metadata.all_hosts()
                   if h.datacenter != self.cfg.dc and h.is_up is False)

    def close(self) -> None:
        self._cluster.shutdown()

