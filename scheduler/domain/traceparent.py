"""W3C Trace Context ``traceparent`` values: parsed, checked and formatted. Pure, no I/O.

A ``traceparent`` is ``VERSION-TRACEID-PARENTID-FLAGS``: ``00-`` then 32 and 16 lowercase
hex digits (neither all zeros) and two hex digits of flags (bit 0: sampled), 55 characters
(https://www.w3.org/TR/trace-context/#traceparent-header). A job stores the one of the
span that scheduled it; the poller reads it back as the parent of each attempt's span.

Two readers, both total (any object in, a value or None out, never an exception):

- ``stored_traceparent``: a value read from a store. Only the exact form this code writes
  (version 00) is accepted; anything else (a row written by another program) is ignored.
- ``parse_traceparent``: a header from outside (the HTTP API's requests). The spec's
  forward-compatible rules: a higher version may append fields after a ``-``; version
  ``ff`` is invalid. Returned in the stored form (version 00).
"""

from __future__ import annotations

import re
from typing import NamedTuple

TRACEPARENT_LEN = 55
# Lowercase only: the spec's HEXDIGLC. (\Z, not $: $ would accept a trailing newline.)
_V00 = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})\Z")
_ANY = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-|\Z)")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


class TraceParent(NamedTuple):
    trace_id: int
    span_id: int
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 1)

    def text(self) -> str:
        """The version-00 form: what a store holds and a request carries."""
        return format_traceparent(self.trace_id, self.span_id, self.flags)


def format_traceparent(trace_id: int, span_id: int, flags: int) -> str:
    """The version-00 ``traceparent`` of these ids; ``ValueError`` for an id that is zero
    or out of range (an invalid span has no traceparent)."""
    if not (0 < trace_id < 1 << 128 and 0 < span_id < 1 << 64 and 0 <= flags < 256):
        raise ValueError("not a valid span context: zero or out-of-range ids")
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"


def stored_traceparent(value: object) -> str | None:
    """``value`` if it is a version-00 ``traceparent`` exactly as this code writes it, else
    None: a stored value that is not (a blob, a number, text from another program) is
    ignored, and the job runs as one without a trace context."""
    if type(value) is not str or len(value) != TRACEPARENT_LEN:
        return None
    m = _V00.match(value)
    if m is None or m.group(1) == _ZERO_TRACE or m.group(2) == _ZERO_SPAN:
        return None
    return value


def parse_stored(value: str) -> TraceParent | None:
    """A stored value's ids, or None (see ``stored_traceparent``)."""
    if stored_traceparent(value) is None:
        return None
    return TraceParent(int(value[3:35], 16), int(value[36:52], 16), int(value[53:55], 16))


def parse_traceparent(header: object) -> TraceParent | None:
    """An incoming ``traceparent`` header by the spec's rules, or None when it is invalid
    (the request is then handled as one without a trace context: never an error).
    Leading and trailing blanks (optional whitespace around a header value) are dropped;
    at most 512 characters are looked at."""
    if not isinstance(header, str) or len(header) > 512:
        return None
    text = header.strip(" \t")
    m = _ANY.match(text)
    if m is None:
        return None
    version, trace, span, flags = m.groups()
    if version == "ff" or trace == _ZERO_TRACE or span == _ZERO_SPAN:
        return None
    if version == "00" and len(text) != TRACEPARENT_LEN:
        return None  # version 00 has exactly four fields
    # Of a later version's flags only the sampled bit is known (the spec says to keep it).
    return TraceParent(int(trace, 16), int(span, 16), int(flags, 16) & (0xFF if version == "00" else 1))
