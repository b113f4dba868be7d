"""``JobSpec``: one job to schedule, and how a JSON-lines record becomes one. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from .errors import InvalidInput


@dataclass(frozen=True)
class JobSpec:
    """One job to schedule, as ``schedule`` takes it."""

    job_id: str
    due_at: datetime
    kind: str
    payload: Any = None
    jitter_s: float = 0.0


def spec_from_dict(raw: dict[str, Any], index: int) -> JobSpec:
    """A JobSpec from a JSON-lines record: ``id``/``job_id``, ``at``/``due_at``, ``kind``,
    optional ``payload`` and ``jitter``."""
    from .model import parse_time

    if not isinstance(raw, dict):
        raise InvalidInput(f"job #{index + 1}: expected an object, got {type(raw).__name__}")
    job_id = raw.get("job_id", raw.get("id"))
    at = raw.get("due_at", raw.get("at"))
    if not isinstance(at, str | datetime):
        raise InvalidInput(f"job #{index + 1}: missing due_at (an ISO 8601 time with an offset)")
    unknown = set(raw) - {"job_id", "id", "due_at", "at", "kind", "payload", "jitter", "jitter_s"}
    if unknown:
        raise InvalidInput(f"job #{index + 1}: unknown field(s) {', '.join(sorted(unknown))}")
    try:
        due = at if isinstance(at, datetime) else parse_time(at)
    except InvalidInput as exc:
        raise InvalidInput(f"job #{index + 1}: {exc}") from None
    jitter = raw.get("jitter", raw.get("jitter_s", 0.0))
    if not isinstance(jitter, int | float):
        raise InvalidInput(f"job #{index + 1}: jitter must be a number of seconds")
    # id and kind are checked by Client.build, which names the job on error.
    return JobSpec(job_id=cast(str, job_id), due_at=due, kind=cast(str, raw.get("kind")),
                   payload=raw.get("payload"), jitter_s=float(jitter))
