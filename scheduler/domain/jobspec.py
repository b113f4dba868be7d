"""``JobSpec``: one job to schedule, and how a JSON-lines record becomes one. Pure.

JSON from outside (``--payload``, the lines of ``scheduler load``) is read by
``loads``: strict JSON only, so ``InvalidInput`` is the one error any text can raise.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from ..errors import InvalidInput
from .flow import DEFAULT_PRIORITY, check_key, check_priority


@dataclass(frozen=True)
class JobSpec:
    """One job to schedule, as ``schedule`` takes it. ``priority`` 0-9 (9 starts first);
    ``key`` None or 1-256 bytes of text (``flow.check_key``): a keyed job is placed in its
    key's shard. Both are checked when the job is placed, before anything is written."""

    job_id: str
    due_at: datetime
    kind: str
    payload: Any = None
    jitter_s: float = 0.0
    priority: int = DEFAULT_PRIORITY
    key: str | None = None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (JavaScript's, not JSON's)")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400: stored as Infinity, which is not JSON
        raise ValueError(f"number {text[:40]} is too large for a double")
    return value


def _whole(text: str) -> int:
    # A whole number beyond a double is refused as 1e400 is (other languages' readers
    # could not hold it); the length test first keeps Python's own refusal (over 4,300
    # digits, telling the caller to change a setting) and a slow int() out of reach.
    if len(text) < 300:  # far below a double's largest (about 1.8e308)
        return int(text)
    value = int(text) if len(text) <= 320 else None
    if value is None or abs(value) > sys.float_info.max:
        shown = text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"
        raise ValueError(f"number {shown} is too large for a double")
    return value


def loads(text: str | bytes, what: str) -> Any:
    """The JSON value of ``text``; ``InvalidInput`` naming ``what`` for anything that is
    not strict JSON: a syntax error, ``NaN``/``Infinity`` (Python's json takes them,
    other languages' readers of the payload would not), a number too large for a double
    (``1e400``: it would be written back as ``Infinity``; a whole number beyond a
    double's largest), nesting too deep for the parser, bytes that are not UTF-8."""
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite, parse_int=_whole)
    except RecursionError:
        raise InvalidInput(f"{what} is nested too deeply to read as JSON") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InvalidInput(f"{what} is not valid JSON ({exc})") from None


def records_from_lines(lines: Iterable[str], source: str) -> list[Any]:
    """The JSON value of each non-blank line of a JSON-lines text, in order. The first
    bad line raises ``InvalidInput`` naming ``source:line``; nothing else is raised."""
    records = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            records.append(loads(line, f"{source}:{n}"))
    return records


# A JSON-lines record's short names and the canonical ones: either, never both.
ALIASES = (("id", "job_id"), ("at", "due_at"), ("jitter", "jitter_s"))


def spec_from_dict(raw: dict[str, Any], index: int) -> JobSpec:
    """A JobSpec from a JSON-lines record: ``id``/``job_id``, ``at``/``due_at``, ``kind``,
    optional ``payload``, ``jitter``/``jitter_s`` (a name or its alias, never both),
    ``priority`` (a whole number 0-9, not text) and ``key`` (text, or null for none).
    Raises ``InvalidInput`` naming the job's 1-based ``index`` for anything else."""
    from .model import parse_time

    if not isinstance(raw, dict):
        raise InvalidInput(f"job #{index + 1}: expected an object, got {type(raw).__name__}")
    for alias, name in ALIASES:
        # Both given, one would silently win: refused, whatever the two values are.
        if alias in raw and name in raw:
            raise InvalidInput(f"job #{index + 1}: both {alias} and {name} given; give one")
    job_id = raw.get("job_id", raw.get("id"))
    at_name = "due_at" if "due_at" in raw else "at"
    at = raw.get(at_name)
    if at is None:
        raise InvalidInput(f"job #{index + 1}: missing due_at (an ISO 8601 time with an offset)")
    if not isinstance(at, str | datetime):
        raise InvalidInput(f"job #{index + 1}: {at_name} must be a string (an RFC 3339 time such as "
                           f"2027-03-01T09:00:00Z), not {type(at).__name__}")
    unknown = set(raw) - {"job_id", "id", "due_at", "at", "kind", "payload", "jitter", "jitter_s",
                          "priority", "key"}
    if unknown:
        raise InvalidInput(f"job #{index + 1}: unknown field(s) {', '.join(sorted(unknown))}")
    try:
        due = at if isinstance(at, datetime) else parse_time(at)
    except InvalidInput as exc:
        raise InvalidInput(f"job #{index + 1}: {exc}") from None
    jitter = raw.get("jitter", raw.get("jitter_s", 0.0))
    if isinstance(jitter, bool) or not isinstance(jitter, int | float):
        raise InvalidInput(f"job #{index + 1}: jitter must be a number of seconds")
    try:
        jitter_s = float(jitter)
    except OverflowError:  # an integer of hundreds of digits
        raise InvalidInput(f"job #{index + 1}: jitter {jitter} is out of range") from None
    try:
        # JSON's 5.0 is a float and "5" is text: both refused (a bool too), as by the API.
        priority = check_priority(raw.get("priority", DEFAULT_PRIORITY))
        key = None if raw.get("key") is None else check_key(raw["key"])
    except InvalidInput as exc:
        raise InvalidInput(f"job #{index + 1}: {exc}") from None
    # id and kind are checked by Client.build, which names the job on error.
    return JobSpec(job_id=cast(str, job_id), due_at=due, kind=cast(str, raw.get("kind")),
                   payload=raw.get("payload"), jitter_s=jitter_s, priority=priority, key=key)


def canonical(data: bytes) -> str:
    """A JSON payload's value as text that does not depend on its key order or spacing
    (but does on ``1`` against ``1.0`` against ``true``): how a payload sent again is
    compared with the stored one. Raises ``ValueError`` (or ``RecursionError``)."""
    return json.dumps(json.loads(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
