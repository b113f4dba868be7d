"""A recurring schedule as stored, the ids of its occurrences, and the checks every
``create``/``update`` goes through. Pure: no I/O.

Each occurrence is an ordinary one-shot job whose id is
``recurring:<schedule id>:<version>:<nominal epoch ms>``: every writer of an occurrence
(two pollers, one poller retrying) writes the same row, so the chain cannot fork. The
version is bumped by every ``update`` and by ``delete``, so occurrences of an older
version are recognised as superseded, and a schedule re-created under the same id
starts a fresh chain (bullmq#3063).

A domain module, below the store (which reads and writes these rows) and the recurring
API (``scheduler.recurring``, which changes them): it imports neither.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple

from ..domain.flow import DEFAULT_PRIORITY
from ..domain.jobspec import canonical
from ..domain.keys import from_ms
from ..domain.model import OCCURRENCE_PREFIX
from ..domain.model import parse_occurrence as _parse
from ..errors import InvalidInput
from .rule import Rule, zone

MAX_SCHEDULE_ID_BYTES = 200  # the occurrence id adds at most 56 bytes to reach 256
DEFAULT_CATCHUP_WINDOW_S = 3600
MAX_JITTER_S = 3600
# How much earlier than an occurrence's earliest possible change its blind writes are
# dated (``producer.occurrences.write``; the store dates none later than its host's clock
# less this): more than any clock skew the fleet tolerates.
WRITE_TIME_SLACK_MS = 60_000


class Overlap(StrEnum):
    ALLOW = "allow"
    SKIP = "skip"
    BUFFER_ONE = "buffer_one"


class Misfire(StrEnum):
    FIRE_ONCE = "fire_once"
    FIRE_ALL = "fire_all"
    SKIP = "skip"


class State(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    DELETED = "deleted"


class Occurrence(NamedTuple):
    schedule_id: str
    version: int
    nominal_ms: int


def occurrence_id(schedule_id: str, version: int, nominal_ms: int) -> str:
    return f"{OCCURRENCE_PREFIX}{schedule_id}:{version}:{nominal_ms}"


def parse_occurrence(job_id: str) -> Occurrence | None:
    """The occurrence a job id names, or None for a one-shot job."""
    parsed = _parse(job_id)
    return None if parsed is None else Occurrence(*parsed)


def check_schedule_id(schedule_id: object) -> str:
    """``schedule_id`` if it can name a stored schedule; ``InvalidInput`` otherwise (a lone
    surrogate, as Python reads an undecodable byte of argv, cannot be stored)."""
    if not isinstance(schedule_id, str) or not schedule_id:
        raise InvalidInput("schedule id must be a non-empty string")
    try:
        size = len(schedule_id.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInput("schedule id must be valid UTF-8 (it contains a lone surrogate)") from None
    if size > MAX_SCHEDULE_ID_BYTES:
        raise InvalidInput(f"schedule id is longer than {MAX_SCHEDULE_ID_BYTES} bytes of UTF-8")
    return schedule_id


@dataclass(frozen=True)
class Schedule:
    """A schedule's row. ``version`` starts at 1; ``state`` is active, paused or deleted
    (a deleted row is kept, so that a re-created schedule gets a new version). Every
    occurrence has the schedule's ``priority`` and ``key`` (see ``domain.model.Job``)."""

    schedule_id: str
    kind: str
    rule: Rule
    payload: bytes = b"null"
    payload_json: bool = True
    start_ms: int | None = None
    end_ms: int | None = None
    overlap: Overlap = Overlap.ALLOW
    misfire: Misfire = Misfire.FIRE_ONCE
    catchup_window_s: int = DEFAULT_CATCHUP_WINDOW_S
    jitter_s: int = 0
    version: int = 1
    state: State = State.ACTIVE
    created_ms: int = 0
    updated_ms: int = 0
    skipped: int = field(default=0, compare=False)
    priority: int = DEFAULT_PRIORITY
    key: str | None = None

    def same_definition(self, other: Schedule) -> bool:
        """Whether ``other`` defines the same schedule (ignoring version, state, times)."""
        def norm(s: Schedule) -> Schedule:
            # Without --start an interval is anchored at its creation: not part of what
            # the caller defined.
            rule = s.rule if s.start_ms is not None else replace(s.rule, anchor_ms=0)
            payload = s.payload
            if s.payload_json:
                # A JSON payload is its value: the same keys in another order (as another
                # language's encoder writes them) are the same definition.
                with contextlib.suppress(ValueError, RecursionError):  # a poison row's: as stored
                    payload = canonical(payload).encode()
            return replace(s, rule=rule, payload=payload, version=0, state=State.ACTIVE, created_ms=0,
                           updated_ms=0)

        return norm(self) == norm(other)

    def first_after(self, t_ms: int) -> int | None:
        """The first nominal time after ``t_ms`` (and not before the start), or None
        past the end."""
        t = t_ms if self.start_ms is None else max(t_ms, self.start_ms - 1)
        nxt = self.rule.after(t)
        return None if self.end_ms is not None and nxt > self.end_ms else nxt

    def occurrence(self, nominal_ms: int) -> Occurrence:
        return Occurrence(self.schedule_id, self.version, nominal_ms)

    def to_dict(self, next_fire_ms: int | None = None, last_fired_ms: int | None = None) -> dict[str, Any]:
        """The stable JSON view of ``recurring get``/``list``."""
        tz = zone(self.rule.tz)

        def iso(ms: int | None) -> str | None:
            return None if ms is None else from_ms(ms).astimezone(tz).isoformat()

        return {
            "schedule_id": self.schedule_id,
            "state": str(self.state),
            "version": self.version,
            "kind": self.kind,
            "cron": self.rule.cron,
            "every_s": self.rule.every_s,
            "tz": self.rule.tz,
            "start": iso(self.start_ms),
            "end": iso(self.end_ms),
            "next_fire_at": iso(next_fire_ms),
            "last_fired_at": iso(last_fired_ms),
            "overlap": str(self.overlap),
            "misfire": str(self.misfire),
            "catchup_window_s": self.catchup_window_s,
            "jitter_s": self.jitter_s,
            "skipped": self.skipped,
            "priority": self.priority,
            "key": self.key,
        }


def choice(enum: type[StrEnum], value: object, flag: str) -> Any:
    try:
        return enum(str(value))
    except ValueError:
        raise InvalidInput(f"{flag} {value!r} is unknown: use one of "
                           f"{', '.join(e.value for e in enum)}") from None


def check_window(start_ms: int | None, end_ms: int | None) -> None:
    if start_ms is not None and end_ms is not None and end_ms <= start_ms:
        raise InvalidInput(f"--end {from_ms(end_ms).isoformat()} must be after --start "
                           f"{from_ms(start_ms).isoformat()}")


def check_jitter(jitter_s: int) -> int:
    if not 0 <= jitter_s <= MAX_JITTER_S:
        raise InvalidInput(f"--jitter must be between 0s and {MAX_JITTER_S}s, got {jitter_s} s")
    return jitter_s


def aware_ms(value: datetime | None, flag: str) -> int | None:
    from ..domain.model import check_due

    if value is None:
        return None
    try:
        return check_due(value)
    except InvalidInput as exc:
        raise InvalidInput(f"{flag}: {exc}") from None
