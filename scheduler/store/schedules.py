"""The storage interface's part for recurring schedules (``Store`` inherits it): their
rows and skip counters. Every method does all of its work or raises a
``SchedulerError``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from ..domain.model import Job
from ..recurring.schedule import Schedule


class ScheduleRows(ABC):
    """The rows of recurring schedules (``scheduler.recurring.schedule``), fenced by their version."""

    @abstractmethod
    def insert_schedule(self, schedule: Schedule) -> bool:
        """Create the schedule's row unless one exists (a lightweight transaction in
        Cassandra); False when it exists."""

    @abstractmethod
    def replace_schedule(self, schedule: Schedule, expected_version: int) -> bool:
        """Overwrite the row if its version is still ``expected_version``; False when
        another change came first (nothing is written)."""

    @abstractmethod
    def get_schedules(self, schedule_ids: Sequence[str]) -> dict[str, Schedule]:
        """The rows of the schedules that exist, by id (``skipped`` is 0: see
        ``skipped``). A few round trips at most, concurrently (Cassandra: one per 64 ids)."""

    @abstractmethod
    def list_schedules(self, after: str | None = None, limit: int | None = None) -> list[Schedule]:
        """Every schedule row, deleted ones included. With ``limit``: a page of at most
        that many, after the schedule id ``after``, in the store's own order (Cassandra:
        token order), so that the last id of a page is the next page's ``after``."""

    @abstractmethod
    def skipped(self, schedule_id: str) -> int:
        """How many occurrences of the schedule were skipped."""

    @abstractmethod
    def add_skipped(self, schedule_id: str, n: int) -> None:
        """Count ``n`` more skipped occurrences (a counter: not idempotent)."""

    @abstractmethod
    def record_skipped(self, job: Job, reason: str, now_ms: int) -> None:
        """Mark an occurrence's row complete without firing it, and its job cancelled
        with ``reason``, atomically."""
