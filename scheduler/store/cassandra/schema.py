"""The Cassandra store's schema and keyspace settings (a mixin of ``CassandraStore``,
which provides the session and ``run``): schema apply (versioned CQL files from
``cql/versions``, waiting for the nodes to agree on each change), the keyspace's
settings, and the shard layouts with their marks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ...domain.keys import bucket_of_ms
from ...domain.layout import Layout, Layouts
from ...errors import ConfigError, SchedulerError, SchemaError, StoreUnavailable
from .. import queries
from ..base import SCHEMA_VERSION, SchemaOptions, SchemaResult, StoreMeta, layouts_of
from ..rows import meta_items, retention_changes, retention_of
from .conf import dt_ms, replication_map, translate
from .run import CqlSteps, Run, RunStatement, dual

# How long schema apply waits, beyond the driver's 10 s, for every node to have a change.
SCHEMA_AGREEMENT_S = 60.0


class CassandraSchema:
    url: str
    keyspace: str
    session: Any  # the driver's Session (the driver ships no type information)
    run: RunStatement
    meta: Callable[[], StoreMeta]

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
        try:
            rows = list(self.session.execute(
                queries.named("keyspace.cql")["select_schema_version"].replace("{keyspace}", self.keyspace)))
        except Exception as exc:  # the node went away between the two reads: a store error
            raise translate(exc, "reading the schema version") from exc
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

    def release_version(self) -> str:
        return str(self.run("release_version")[0][0])
