"""The job record and the input rules every ``schedule`` call is checked against.

Pure, no I/O. Validation happens before anything is written, so a rejected call
leaves the store untouched.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, NamedTuple

from ..errors import InvalidInput
from .keys import from_ms, to_ms

MAX_JOB_ID_BYTES = 256
DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024
# Ids of the occurrences of recurring schedules: recurring:<schedule>:<version>:<nominal
# ms>. Reserved: a one-shot job's id cannot start with it.
OCCURRENCE_PREFIX = "recurring:"

# The kind of a row that could not be read as a job: no producer can write it (it fails
# KIND_RE), and the poller dead-letters it with the reason in ``last_error``.
POISON_KIND = "!poison"
KIND_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,63}\Z")


class Status(StrEnum):
    PENDING = "pending"
    FIRED = "fired"
    CANCELLED = "cancelled"
    DEAD = "dead"


class Job(NamedTuple):
    """A scheduled job as stored. Immutable; ``evolve`` returns a changed copy.

    (A NamedTuple rather than a frozen dataclass: the poller builds one per row read,
    and this is five times cheaper to construct.)

    ``due_ms`` is the time the producer asked for (kept for lateness accounting);
    ``fire_ms`` is where the job sits in the bucket table: the due time plus any
    jitter, moved forward for a late write. Both are epoch milliseconds.

    ``priority`` (0-9, 9 starts first) and ``key`` (None, or 1-256 bytes: the unit of
    per-key concurrency; a keyed job's shard is its key's, see ``keys.shard_key``) are
    checked by ``flow.check_priority`` and ``flow.check_key`` before anything is written.
    """

    job_id: str
    kind: str
    # The payload as stored: JSON text when ``data_json``, else the caller's bytes.
    data: bytes
    data_json: bool
    due_ms: int
    fire_ms: int
    bucket: int
    shard: int
    status: Status = Status.PENDING
    attempts: int = 0
    fired_ms: int | None = None
    last_error: str | None = None
    # flow.DEFAULT_PRIORITY (flow imports this module, so it cannot be imported here;
    # tests/unit/test_priority_key_cli.py checks that the two agree).
    priority: int = 5
    key: str | None = None
    # The W3C ``traceparent`` of the span that scheduled the job (schema v010; None when
    # none was current, or the stored value was not one: see ``domain.traceparent``). An
    # attempt's span is its child. Not in ``to_dict``: a propagation detail, not the job's.
    traceparent: str | None = None

    @property
    def due_at(self) -> datetime:
        return from_ms(self.due_ms)

    @property
    def fire_at(self) -> datetime:
        return from_ms(self.fire_ms)

    @property
    def fired_at(self) -> datetime | None:
        return None if self.fired_ms is None else from_ms(self.fired_ms)

    @property
    def attempt(self) -> int:
        """The attempt a handler sees: 1 for the first try."""
        return self.attempts + 1

    @property
    def payload(self) -> Any:
        """The payload as given to ``schedule``: bytes, or the decoded JSON value."""
        return json.loads(self.data) if self.data_json else self.data

    @property
    def schedule_id(self) -> str | None:
        """The recurring schedule this job is an occurrence of; None for a one-shot job."""
        occ = parse_occurrence(self.job_id)
        return None if occ is None else occ[0]

    @property
    def scheduled_for(self) -> datetime | None:
        """An occurrence's nominal time (before jitter); None for a one-shot job."""
        occ = parse_occurrence(self.job_id)
        return None if occ is None else from_ms(occ[2])

    def evolve(self, **changes: Any) -> Job:
        return self._replace(**changes)

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON view used by ``--json`` and the docs."""
        return {
            "job_id": self.job_id,
            "kind": self.kind,
            "due_at": self.due_at.isoformat(),
            "fire_at": self.fire_at.isoformat(),
            "bucket": self.bucket,
            "shard": self.shard,
            "status": str(self.status),
            "attempts": self.attempts,
            "fired_at": None if self.fired_at is None else self.fired_at.isoformat(),
            "last_error": self.last_error,
            "refired_from": refired_from(self.job_id),
            "priority": self.priority,
            "key": self.key,
        }



# Ids of re-fired jobs (``scheduler refire``): refire:<from ms>-<to ms>:<old id>.
REFIRE_RE = re.compile(r"^refire:(\d+)-(\d+):(.+)\Z", re.S)


def refired_from(job_id: str) -> str | None:
    """The id a re-fired job came from (``#<hash>`` when the old id was too long to
    keep); None for any other job."""
    m = REFIRE_RE.match(job_id)
    return m.group(3) if m else None


def parse_occurrence(job_id: str) -> tuple[str, int, int] | None:
    """``(schedule id, version, nominal ms)`` of an occurrence's id, else None."""
    if not job_id.startswith(OCCURRENCE_PREFIX):
        return None
    head, _, nominal = job_id.rpartition(":")
    sid, _, version = head.rpartition(":")
    if not (nominal.isdigit() and version.isdigit()) or len(sid) <= len(OCCURRENCE_PREFIX):
        return None
    return sid[len(OCCURRENCE_PREFIX):], int(version), int(nominal)


def check_job_id(job_id: object) -> str:
    """An id a producer may write: ``check_stored_id``, and not an occurrence's."""
    check_stored_id(job_id)
    assert isinstance(job_id, str)
    if job_id.startswith(OCCURRENCE_PREFIX):
        raise InvalidInput(f"job ids starting with {OCCURRENCE_PREFIX!r} are reserved for the "
                           "occurrences of recurring schedules; use another id (to change an "
                           "occurrence, update, pause or delete its schedule)")
    return job_id


def check_stored_id(job_id: object) -> str:
    """An id that can name a stored job, an occurrence's included (for reads); raises
    ``InvalidInput`` for anything else."""
    if not isinstance(job_id, str) or not job_id:
        raise InvalidInput("job id must be a non-empty string")
    try:
        size = len(job_id.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInput("job id must be valid UTF-8 (it contains a lone surrogate)") from None
    if size > MAX_JOB_ID_BYTES:
        raise InvalidInput(f"job id is {size} bytes; the limit is {MAX_JOB_ID_BYTES} bytes of UTF-8")
    return job_id


def check_kind(kind: object) -> str:
    if not isinstance(kind, str) or not KIND_RE.match(kind):
        raise InvalidInput(
            f"kind {kind!r} is not a short identifier: use 1-64 characters of letters, digits, "
            "'_', '.', ':' or '-', starting with a letter or '_'"
        )
    return kind


def check_due(due_at: object) -> int:
    """Epoch ms of an aware datetime; a naive one is an error, never taken as UTC."""
    if not isinstance(due_at, datetime):
        raise InvalidInput(f"due time must be a datetime, got {type(due_at).__name__}")
    if due_at.tzinfo is None or due_at.tzinfo.utcoffset(due_at) is None:
        raise InvalidInput(
            f"due time {due_at.isoformat()} has no timezone; pass an aware datetime "
            "(e.g. with tzinfo=datetime.UTC)"
        )
    return to_ms(due_at)


def encode_payload(payload: object, limit: int) -> tuple[bytes, bool]:
    """Encode a payload to ``(bytes, is_json)``, enforcing the size limit."""
    if isinstance(payload, bytes | bytearray | memoryview):
        data, is_json = bytes(payload), False
    else:
        try:
            data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidInput(f"payload must be bytes or JSON-serialisable: {exc}") from None
        is_json = True
    if len(data) > limit:
        raise InvalidInput(
            f"payload is {len(data)} bytes; the limit is {limit} bytes "
            "(raise max_payload_bytes, or store the data elsewhere and pass a reference)"
        )
    return data, is_json


# The instants ``parse_time`` accepts: every one of them converts to epoch milliseconds
# and back (``keys.from_ms``) on any platform.
EARLIEST_TIME = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_TIME = datetime(9999, 12, 31, tzinfo=UTC)


def parse_time(text: str) -> datetime:
    """Parse ISO 8601 with an explicit offset ('Z' allowed), between 1970-01-01 and
    9999-12-31 UTC. ``InvalidInput`` for anything else; nothing else is raised for any
    text."""
    shown = repr(text[:64] + ("..." if len(text) > 64 else ""))
    if not any(sep in text.strip() for sep in "Tt "):
        # A date alone (2027-03-02Z): Python reads some of these with the offset as a
        # time of day, so say what is missing instead of suggesting another offset.
        raise InvalidInput(f"time {shown} has no time of day: give one with an offset, "
                           "e.g. 2027-03-02T09:00:00Z")
    try:
        dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidInput(
            f"cannot parse time {shown}: use ISO 8601 with an offset, e.g. 2027-03-01T09:00:00Z"
        ) from None
    if dt.tzinfo is None:
        raise InvalidInput(
            f"time {shown} has no UTC offset: add one, e.g. {text.strip()[:64]}Z or {text.strip()[:64]}+01:00"
        )
    try:
        in_range = EARLIEST_TIME <= dt.astimezone(UTC) <= LATEST_TIME
    except OverflowError:  # year 1 or 9999 pushed past the calendar by its offset
        in_range = False
    if not in_range:
        raise InvalidInput(f"time {shown} is out of range: give one between 1970-01-01 and "
                           "9999-12-31 UTC")
    return dt
