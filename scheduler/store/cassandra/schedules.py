"""The Cassandra store's recurring-schedule methods (a mixin of ``CassandraStore``,
which provides ``run``, ``_batch``, ``prepared`` and ``job_ttl``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...domain.model import Job
from ...recurring.schedule import Schedule
from ..rows import bucket_key, schedule_from_row, schedule_params
from .conf import READ_GROUP
from .run import CqlSteps, Lwt, Many, Run, RunStatement, dual


class CassandraSchedules:
    run: RunStatement
    _batch: Callable[[str, list[tuple[str, tuple[Any, ...]]]], None]
    prepared: Callable[[str], Any]  # a driver's PreparedStatement (the driver ships no types)
    job_ttl: Callable[[Job], int]

    @dual
    def insert_schedule(self, schedule: Schedule) -> CqlSteps[bool]:
        applied = yield Lwt("insert_schedule", schedule_params(schedule),
                            f"creating schedule {schedule.schedule_id!r}")
        return bool(applied)

    @dual
    def replace_schedule(self, schedule: Schedule, expected_version: int) -> CqlSteps[bool]:
        sid, *rest = schedule_params(schedule)
        applied = yield Lwt("replace_schedule", (*rest, sid, expected_version),
                            f"changing schedule {schedule.schedule_id!r}")
        return bool(applied)

    @dual
    def get_schedules(self, schedule_ids: Sequence[str]) -> CqlSteps[dict[str, Schedule]]:
        ids = list(dict.fromkeys(schedule_ids))
        if len(ids) == 1:  # no fan-out machinery for one
            rows = yield Run("select_schedule", (ids[0],), f"reading schedule {ids[0]!r}")
            return {ids[0]: schedule_from_row(rows[0])} if rows else {}
        # Multi-partition IN in small groups: the client's CPU per request, not the
        # server, is what a poller reading a schedule per occurrence runs out of.
        stmt = self.prepared("select_schedules_in")
        groups = [(ids[i:i + READ_GROUP],) for i in range(0, len(ids), READ_GROUP)]
        found = (schedule_from_row(r) for rows in (yield Many([(stmt, g) for g in groups],
                                                              "reading schedules")) for r in rows)
        return {s.schedule_id: s for s in found}

    @dual
    def list_schedules(self, after: str | None = None, limit: int | None = None) -> CqlSteps[list[Schedule]]:
        if limit is not None:  # a page, in token order
            page = (yield Run("select_schedules_first", (limit,), "listing schedules") if after is None
                    else Run("select_schedules_after", (after, limit), "listing schedules"))
            return [schedule_from_row(r) for r in page]
        rows = yield Run("select_schedules", (), "listing schedules")
        return sorted((schedule_from_row(r) for r in rows), key=lambda s: s.schedule_id)

    @dual
    def skipped(self, schedule_id: str) -> CqlSteps[int]:
        rows = yield Run("select_skipped", (schedule_id,), f"reading schedule {schedule_id!r}")
        return int(rows[0][0] or 0) if rows else 0

    def add_skipped(self, schedule_id: str, n: int) -> None:
        self.run("add_skipped", (n, schedule_id), f"counting skips of {schedule_id!r}")

    def record_skipped(self, job: Job, reason: str, now_ms: int) -> None:
        ttl = self.job_ttl(job)
        self._batch(f"skipping {job.job_id!r}", [
            ("mark_fired", (ttl, now_ms, *bucket_key(job))),
            ("record_skipped", (ttl, reason, now_ms, job.job_id)),
        ])
