"""Riding out a fault: log it once, summarise it while it lasts, back off, and say
when it ended.

An outage of the store makes every call fail: the poll loop's reads, the recorder's
writes, the checkpoints. Logging each failure wrote ~1,300 lines a second before this
module existed (issue 12). ``FaultLog`` turns them into one line when the fault starts,
one summary at most every ``summary_s`` while it lasts, and one line when it ends.
``Backoff`` spaces the retries. Both take the monotonic clock as an argument and do no
I/O beyond the logger they are given, so they are tested without servers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

SUMMARY_S = 30.0


class FaultLog:
    """One fault (for example "the store"), shared by the threads that meet it.

    ``failed`` and ``ok`` may be called from any thread. ``failing_for`` is 0 while the
    last call succeeded, else the seconds since the first failure of this spell.
    """

    def __init__(self, logger: logging.Logger, what: str, *, action: str,
                 monotonic: Callable[[], float] = time.monotonic, summary_s: float = SUMMARY_S) -> None:
        self.log, self.what, self.action = logger, what, action
        self.monotonic = monotonic
        self.summary_s = summary_s
        self._lock = threading.Lock()
        self._since: float | None = None
        self._failures = 0  # in this spell
        self._unreported = 0  # since the last line
        self._last_line = 0.0
        self.spells = 0

    def failed(self, exc: BaseException | str) -> None:
        now = self.monotonic()
        with self._lock:
            self._failures += 1
            if self._since is None:
                self._since, self._last_line, self._unreported = now, now, 0
                self.spells += 1
                first = True
            else:
                self._unreported += 1
                first = False
                if now - self._last_line < self.summary_s:
                    return
                n, self._unreported, self._last_line = self._unreported, 0, now
                for_s = now - self._since
        if first:
            self.log.warning("%s failing: %s (logged once; a summary follows every %d s)",
                             self.what, exc, int(self.summary_s),
                             extra={"action": f"{self.action}_failing"})
        else:
            self.log.warning("%s still failing after %.0f s: %d more failures, last: %s",
                             self.what, for_s, n, exc,
                             extra={"action": f"{self.action}_still_failing", "failures": n,
                                    "failing_s": round(for_s, 1)})

    def ok(self) -> None:
        if self._since is None:  # the common case, without the lock
            return
        now = self.monotonic()
        with self._lock:
            if self._since is None:
                return
            for_s, n = now - self._since, self._failures
            self._since, self._failures, self._unreported = None, 0, 0
        self.log.warning("%s answering again after %.1f s (%d failures)", self.what, for_s, n,
                         extra={"action": f"{self.action}_recovered", "failing_s": round(for_s, 1),
                                "failures": n})

    def failing_for(self) -> float:
        since = self._since
        return 0.0 if since is None else max(0.0, self.monotonic() - since)

    @property
    def failing(self) -> bool:
        return self._since is not None


class Summarised:
    """Events that may come once per job (a handler timing out): the first is logged,
    later ones are counted and summarised in one line at most every ``every_s``."""

    def __init__(self, logger: logging.Logger, action: str, every_s: float = SUMMARY_S,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.log, self.action, self.every_s, self.mono = logger, action, every_s, monotonic
        self._lock = threading.Lock()
        self._count = 0
        self._last_at: float | None = None

    def event(self, message: str) -> None:
        with self._lock:
            now = self.mono()
            if self._last_at is not None and now - self._last_at < self.every_s:
                self._count += 1
                return
            count, self._count, self._last_at = self._count, 0, now
        if count:
            message = f"{message} ({count} more like it in the last {self.every_s:.0f} s)"
        self.log.warning(message, extra={"action": self.action, "count": count + 1})


class Backoff:
    """Exponential delays between retries: ``first``, doubling, capped at ``cap``.

    ``reset`` after a success. Not thread-safe: one per retrying loop.
    """

    def __init__(self, first: float = 0.1, cap: float = 2.0) -> None:
        self.first, self.cap = first, cap
        self._next = first

    def next(self) -> float:
        delay = self._next
        self._next = min(self.cap, self._next * 2)
        return delay

    def reset(self) -> None:
        self._next = self.first


class RateLimitFilter(logging.Filter):
    """Lets through one record per (logger, message template) every ``every_s``; the
    next one that passes says how many were held back. For third-party loggers (the
    Cassandra driver warns on every reconnection attempt to every down host)."""

    def __init__(self, every_s: float = SUMMARY_S, monotonic: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s, self.monotonic = every_s, monotonic
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = self.monotonic()
        with self._lock:
            last, held = self._seen.get(key, (-1e18, 0))
            if now - last < self.every_s:
                self._seen[key] = (last, held + 1)
                return False
            self._seen[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} ({held} similar lines held back in the last {int(self.every_s)} s)"
        return True
