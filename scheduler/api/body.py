"""Reading a request's body and its JSON, bounded, and checking the shape of what came.

A body is read only after the caller's token and role were checked. It is at most
``MAX_BODY_BYTES``: a ``Content-Length`` above that is refused before a byte is read,
and the bytes are counted as they arrive, so a missing or lying length does not help
(413 either way). The JSON must be strict (``jobspec.loads``: no ``NaN``, no number too
large for a double) UTF-8, nested at most ``MAX_DEPTH`` deep (deeper documents would
reach Python's recursion limit when written back), and every field must be known. Each
refusal is an ``ApiError`` (400 or 413) with one line; nothing was written.
"""

from __future__ import annotations

from collections.abc import Collection, MutableMapping
from datetime import datetime
from typing import Any

from starlette.requests import ClientDisconnect, Request

from ..domain.jobspec import loads
from ..domain.model import parse_time
from ..errors import InvalidInput
from .respond import ApiError

MAX_BODY_BYTES = 1024 * 1024
MAX_DEPTH = 64
MAX_BATCH_JOBS = 10_000  # jobs in one POST /v1/jobs/batch
Message = MutableMapping[str, Any]


class _TooLarge(Exception):
    pass


def too_large() -> ApiError:
    return ApiError(413, f"the body is larger than {MAX_BODY_BYTES // 1024 // 1024} MiB: send fewer "
                         "jobs per batch")


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body of ``request``, at most ``limit`` bytes; ``ApiError`` 413 past that (read
    no further than one chunk beyond it), 400 for a ``Content-Length`` that is not a
    number or a client gone before the end."""
    length = request.headers.get("content-length")
    if length is not None:
        if not (length.isascii() and length.isdigit()):
            raise ApiError(400, "the Content-Length header is not a number")
        if int(length) > limit:
            raise too_large()
    chunks: list[bytes] = []
    seen = 0
    try:
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > limit:
                raise _TooLarge
            chunks.append(chunk)
    except _TooLarge:
        raise too_large() from None
    except ClientDisconnect:
        raise ApiError(400, "the client went away before the end of the body") from None
    return b"".join(chunks)


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests arrays and objects more than ``limit`` deep (iterative:
    no recursion, whatever the depth)."""
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in (node.values() if isinstance(node, dict) else node):
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


def parse_json(data: bytes, *, empty: Any = ...) -> Any:
    """The JSON value of a body; ``ApiError`` 400 for bytes that are not UTF-8, text that
    is not strict JSON, or nesting deeper than ``MAX_DEPTH``. An empty body is
    ``empty`` when given, else an error."""
    if not data.strip():
        if empty is not ...:
            return empty
        raise ApiError(400, "the body is empty: send a JSON object (see /openapi.json)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the body is not UTF-8 (bad byte at offset {exc.start}); send JSON in UTF-8") \
            from None
    try:
        value = loads(text, "the body")
    except InvalidInput as exc:
        raise ApiError(400, str(exc)) from None
    if too_deep(value):
        raise ApiError(400, f"the body nests arrays and objects more than {MAX_DEPTH} deep")
    return value


def shown_names(names: Collection[str]) -> str:
    """Field names for a message: sorted, quoted, at most 10 of them."""
    listed = sorted(names)
    text = ", ".join(repr(n[:40]) for n in listed[:10])
    return text + (f" and {len(listed) - 10} more" if len(listed) > 10 else "")


def fields(value: Any, known: Collection[str], what: str) -> dict[str, Any]:
    """``value`` when it is an object with only ``known`` fields; ``InvalidInput`` else."""
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object, not {json_type(value)}")
    unknown = set(value) - set(known)
    if unknown:
        raise InvalidInput(f"{what}: unknown field(s) {shown_names(unknown)}; the fields are "
                           f"{', '.join(sorted(known))}")
    return value


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def text_field(body: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    """``body[name]`` as text (None when absent or null, unless ``required``)."""
    value = body.get(name)
    if value is None:
        if required:
            raise InvalidInput(f"missing field {name!r}")
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string, not {json_type(value)}")
    return value


def time_field(body: dict[str, Any], name: str, *, required: bool = False) -> datetime | None:
    """``body[name]`` as an ISO 8601 time with an offset (``parse_time``)."""
    text = text_field(body, name, required=required)
    if text is None:
        return None
    try:
        return parse_time(text)
    except InvalidInput as exc:
        raise InvalidInput(f"{name}: {exc}") from None


def seconds_field(body: dict[str, Any], name: str) -> str | int | None:
    """``body[name]`` as a duration: text such as ``30s`` or a whole number of seconds."""
    value = body.get(name)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{name} must be a duration such as \"30s\" or a whole number of seconds, "
                           f"not {json_type(value)}")
    return value
