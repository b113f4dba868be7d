"""What the response of an HTTP target means for its job. Pure.

- 2xx: fired.
- 5xx, 408: retried with the kind's backoff (so are timeouts and connection errors,
  which have no status: the handler says so itself).
- 429: retried no sooner than its ``Retry-After`` (seconds, or an HTTP date), clamped to
  ``MAX_RETRY_AFTER_S``; with none, or one that does not parse, the backoff alone.
- Any other status (4xx, 3xx: redirects are not followed): dead-lettered at once, the
  error being the status and the first ``ERROR_BODY_BYTES`` bytes of the body, as one
  line of printable text.
"""

from __future__ import annotations

from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import NamedTuple

# The longest wait a receiver's Retry-After gets: one larger (or a date further ahead) is
# taken as this, so a hostile or broken receiver cannot park a job for years.
MAX_RETRY_AFTER_S = 86_400
ERROR_BODY_BYTES = 200


class Verdict(NamedTuple):
    """``fired``; else ``dead`` (at once) or retried no sooner than ``not_before_s``."""

    fired: bool
    dead: bool
    error: str | None = None
    not_before_s: float = 0.0


def code_class(status: int | None) -> str:
    """The ``code_class`` label of a request: ``2xx``... ``5xx``, or ``error`` when there
    is no response (or a status outside 100-599)."""
    return f"{status // 100}xx" if status is not None and 100 <= status <= 599 else "error"


def printable(text: str) -> str:
    """``text`` as one line of printable characters: every other one (CR, LF, ESC, ...)
    escaped as ``\\n``, ``\\x1b``..., so a stored error or a log line cannot be forged."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def body_excerpt(data: bytes) -> str:
    """The first ``ERROR_BODY_BYTES`` bytes of a body as printable text (a character cut
    in two, or bytes that are not UTF-8, become U+FFFD)."""
    return printable(data[:ERROR_BODY_BYTES].decode("utf-8", "replace"))


def parse_retry_after(value: str | None, now_s: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (RFC 9110 section 10.2.3): a number of
    seconds, or an HTTP date (then less ``now_s``), clamped to 0..``MAX_RETRY_AFTER_S``.
    None when absent or unreadable. Never raises."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return float(MAX_RETRY_AFTER_S if len(text) > 9 else min(int(text), MAX_RETRY_AFTER_S))
    if not text or len(text) > 64 or not text.isascii():
        return None
    try:
        date = parsedate_to_datetime(text)
        # "-0000" reads as a time without a zone; HTTP dates are GMT.
        when = (date if date.tzinfo is not None else date.replace(tzinfo=UTC)).timestamp()
    except (ValueError, TypeError, OverflowError, IndexError, OSError):
        return None
    return float(min(max(0.0, when - now_s), MAX_RETRY_AFTER_S))


def classify(status: int, retry_after: str | None, body_head: bytes, now_s: float,
             source: str = "") -> Verdict:
    """The verdict on a response (see the module); ``source`` (``host:port``) is named in
    the error."""
    if 200 <= status <= 299:
        return Verdict(True, False)
    error = f"HTTP {status}" + (f" from {source}" if source else "")
    if body_head:
        error += f": {body_excerpt(body_head)}"
    if status == 429:
        delay = parse_retry_after(retry_after, now_s)
        if delay is not None:
            error += f" (Retry-After: {delay:g} s)"
        return Verdict(False, False, error, delay or 0.0)
    if status == 408 or not 300 <= status <= 499:
        return Verdict(False, False, error)
    if status <= 399:
        error += " (a redirect, not followed: schedule the final URL)"
    return Verdict(False, True, error)
