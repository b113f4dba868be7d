"""Structured logs: every event carries an ``action`` tag; ``--log-json`` prints one
JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

_STD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
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
    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in record.__dict__.items() if k not in _STD)
        base = f"{self.formatTime(record, '%H:%M:%S')} {record.levelname:<7} {record.getMessage()}"
        return f"{base}  [{extra}]" if extra else base


# Third-party loggers that repeat themselves during an outage: the Cassandra driver
# warns on every reconnection attempt to every down host, kazoo on every retry.
CHATTY = ("cassandra", "kazoo")


def setup(json_output: bool = False, level: str = "INFO") -> None:
    """Our records at ``level``; the drivers' warnings in the same format, each kind of
    line at most once per 30 s (a filter on the handler: logger filters do not reach
    child loggers such as ``cassandra.pool``)."""
    from .faults import RateLimitFilter

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
