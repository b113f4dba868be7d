"""Structured logs: every event carries an ``action`` tag; ``--log-json`` prints one
JSON object per line."""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

_STD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


# Control characters (a newline, an ESC starting a terminal sequence) in an id or an
# error text would split a text line or drive the reader's terminal: shown escaped.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def escape(text: str) -> str:
    """``text`` on one line, control and bidi characters as ``\\xNN``/``\\uNNNN``."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class JsonFormatter(logging.Formatter):
    # UTC, as the Z suffix says (the default converter is local time).
    converter = time.gmtime  # type: ignore[assignment]  # a builtin: not bound, called with the time

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in _STD})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """One line a record, values escaped (``escape``); a record's traceback follows on
    lines of its own, each indented, so no line of it can pass for a record."""

    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={escape(str(v))}" for k, v in record.__dict__.items() if k not in _STD)
        base = f"{self.formatTime(record, '%H:%M:%S')} {record.levelname:<7} {escape(record.getMessage())}"
        line = f"{base}  [{extra}]" if extra else base
        if record.exc_info:
            trace = self.formatException(record.exc_info)
            line += "".join(f"\n    {escape(part)}" for part in trace.splitlines())
        return line


# Third-party loggers that repeat themselves during an outage: the Cassandra driver
# warns on every reconnection attempt to every down host, kazoo on every retry, the
# OpenTelemetry exporter on every batch it cannot send to a collector that is down.
CHATTY = ("cassandra", "kazoo", "opentelemetry")


def setup(json_output: bool = False, level: str = "INFO") -> None:
    """Our records at ``level``; the drivers' warnings in the same format, each kind of
    line at most once per 30 s (a filter on the handler: logger filters do not reach
    child loggers such as ``cassandra.pool``)."""
    from .observe.faults import RateLimitFilter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_output else TextFormatter())
    root = logging.getLogger("scheduler")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    chatty = logging.StreamHandler(sys.stderr)
    chatty.setFormatter(handler.formatter)
    chatty.addFilter(RateLimitFilter())
    for name in CHATTY:
        lib = logging.getLogger(name)
        lib.handlers[:] = [chatty]
        lib.setLevel(logging.WARNING)
        lib.propagate = False
