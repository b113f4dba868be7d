"""What every answer of the API looks like: JSON (ASCII, so any text can be sent), no
caching, and errors as ``{"error": "one line"}`` with the status the typed error calls
for (``status_of``).

- ``InvalidInput``: 400;
- ``JobNotFound``, ``ScheduleNotFound``: 404;
- ``ScheduleConflict``: 409;
- ``StoreUnavailable``, ``WriteTimeout`` and every other ``SchedulerError`` (a schema, a
  role or a setting of the store to fix): 503, with ``Retry-After``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.responses import Response

from ..errors import (
    InvalidInput,
    JobNotFound,
    ScheduleConflict,
    ScheduleNotFound,
    SchedulerError,
)

# What a 503 asks a caller to wait. A guess (nobody knows when a store comes back), kept
# short: every write is idempotent, so a retry costs nothing but a request.
RETRY_AFTER_S = 2
# How much of an error message reaches a caller (a message can quote hostile input).
MESSAGE_MAX = 500
HEADERS = {"cache-control": "no-store", "x-content-type-options": "nosniff"}


class ApiError(Exception):
    """An answer other than 2xx decided by the API itself: ``status`` and one line."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


# The producer's rules are shared with the CLI, whose messages name its flags
# (``--every DURATION``): over HTTP they name the JSON field (``every``). Only the flags
# of fields the API takes, and only in a refusal's message (a 400), where they are the
# rule's own words; a message can also quote input, which may hold the same text.
_FLAG = re.compile(r"(?<![\w'\"/=?-])--(cron|every|tz|catchup-window|jitter|start|end|key|priority|"
                   r"overlap|misfire|payload|kind|at)\b(?: (?:EXPR|DURATION)\b)?")


def as_fields(message: str) -> str:
    """``message`` with each flag of an API field (and its metavar) written as the
    field's name."""
    return _FLAG.sub(lambda m: m.group(1).replace("-", "_"), message)


def one_line(message: str) -> str:
    """``message`` on one line (every run of whitespace becomes a space), at most
    ``MESSAGE_MAX`` characters."""
    text = " ".join(str(message).split())
    return text if len(text) <= MESSAGE_MAX else text[:MESSAGE_MAX - 3] + "..."


def answer(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``data`` as a JSON response. ``ensure_ascii``: a lone surrogate or a control
    character in a stored or quoted text is escaped, never an encoding error."""
    body = json.dumps(data, ensure_ascii=True, separators=(",", ":"), default=str).encode("ascii")
    return Response(body, status, {**HEADERS, **(headers or {})}, media_type="application/json")


def error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """``{"error": "one line"}`` with ``status``; a 503 always carries ``Retry-After``."""
    if status == 503:
        headers = {"retry-after": str(RETRY_AFTER_S), **(headers or {})}
    return answer({"error": one_line(message)}, status, headers)


def status_of(exc: SchedulerError) -> int:
    """The status of a typed error (the list above)."""
    if isinstance(exc, InvalidInput):
        return 400
    if isinstance(exc, JobNotFound | ScheduleNotFound):
        return 404
    if isinstance(exc, ScheduleConflict):
        return 409
    return 503


def refused(exc: SchedulerError) -> Response:
    """The error answer of a typed error."""
    status = status_of(exc)
    return error(status, as_fields(str(exc)) if status == 400 else str(exc))
