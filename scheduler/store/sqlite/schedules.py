"""The embedded store's recurring-schedule rows (a mixin of ``SqliteStore``, which
provides ``_tx``, a transaction, and ``_all``, a read). A schedule's version fences its
changes as Cassandra's lightweight transactions do: an ``UPDATE ... WHERE version = ?``
inside the transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ...domain.model import Job
from ...recurring.schedule import Schedule
from .. import queries
from ..rows import bucket_key, schedule_from_row, schedule_params

# The skip counter: the column of ``select_schedule`` after the 20 of the row itself.
SKIPPED_COLUMN = 20


def _q(name: str) -> str:
    return queries.named("sqlite/queries.sql")[name]


class SqliteSchedules:
    _tx: Callable[[], AbstractContextManager[sqlite3.Connection]]
    _all: Callable[[str, Sequence[Any]], list[Any]]

    def insert_schedule(self, schedule: Schedule) -> bool:
        with self._tx() as db:
            return db.execute(_q("insert_schedule"), schedule_params(schedule)).rowcount == 1

    def replace_schedule(self, schedule: Schedule, expected_version: int) -> bool:
        sid, *rest = schedule_params(schedule)
        with self._tx() as db:
            return db.execute(_q("replace_schedule"), (*rest, sid, expected_version)).rowcount == 1

    def get_schedules(self, schedule_ids: Sequence[str]) -> dict[str, Schedule]:
        out = {}
        for sid in dict.fromkeys(schedule_ids):
            rows = self._all(_q("select_schedule"), (sid,))
            if rows:
                out[sid] = schedule_from_row(rows[0])
        return out

    def list_schedules(self, after: str | None = None, limit: int | None = None) -> list[Schedule]:
        rows = (self._all(_q("select_schedules"), ()) if limit is None
                else self._all(_q("select_schedules_after"), (after or "", limit)))
        return [schedule_from_row(r, int(r[SKIPPED_COLUMN])) for r in rows]

    def skipped(self, schedule_id: str) -> int:
        rows = self._all(_q("select_schedule"), (schedule_id,))
        return int(rows[0][SKIPPED_COLUMN]) if rows else 0

    def add_skipped(self, schedule_id: str, n: int) -> None:
        with self._tx() as db:
            db.execute(_q("add_skipped"), (n, schedule_id))

    def record_skipped(self, job: Job, reason: str, now_ms: int) -> None:
        with self._tx() as db:
            db.execute(_q("mark_fired"), (now_ms, *bucket_key(job)))
            db.execute(_q("record_skipped"), (reason, now_ms, job.job_id))
