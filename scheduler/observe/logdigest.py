"""Rate-limited logging of repeated events: a storm becomes a summary. Pure: no I/O, the
monotonic clock is passed in.

Events come with a *key* (a job kind) and a *category* (an error type). Per key, the
first ``lines`` events of each ``window_s`` window are to be logged one by one; the rest
are only counted, by category, and reported in one summary line once the window is
over (``due``). A window opens at the first event after the previous one ended, so a
steady storm gives at most ``lines`` lines and one summary per key per window, and a
quiet key costs nothing. The first event of each (key, category) is always logged (and
``admit`` says it is the first, for a traceback logged once per error type instead of
per event): a new kind of failure in the middle of a storm is news, and there are only
as many of those lines as there are error types.

(``faults.Summarised`` logs the first event of one stream and counts the rest; this is
the same idea per key, with a per-category breakdown and summaries that come when the
window ends, not only when the next event does.)
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

DEFAULT_LINES = 10
DEFAULT_WINDOW_S = 60.0
# Keys and (key, category) pairs remembered, at most: beyond, keys share one window
# (OTHER) and a first-of-its-type traceback may be logged a second time.
MAX_KEYS = 1_000
OTHER = "(other kinds)"


class Admit(NamedTuple):
    log: bool  # log this event on its own line
    first: bool  # the first event of its (key, category) seen


class Summary(NamedTuple):
    key: str
    held: int  # events counted but not logged in the window
    by_category: dict[str, int]  # of ``held``, most frequent first
    window_s: float


@dataclass
class _Window:
    start: float
    logged: int = 0
    held: Counter[str] = field(default_factory=Counter)


class LogDigest:
    """Decides which events to log and summarises the rest (see the module docstring).
    Thread-safe."""

    def __init__(self, lines: int = DEFAULT_LINES, window_s: float = DEFAULT_WINDOW_S,
                 monotonic: Callable[[], float] = time.monotonic, max_keys: int = MAX_KEYS) -> None:
        if lines < 0 or window_s <= 0:
            raise ValueError("lines must be >= 0 and window_s > 0")
        self.lines, self.window_s, self.mono, self.max_keys = lines, window_s, monotonic, max_keys
        self._windows: dict[str, _Window] = {}
        self._seen: set[tuple[str, str]] = set()
        self._ready: list[Summary] = []  # of windows that ended when a new event came
        self._lock = threading.Lock()

    def admit(self, key: str, category: str) -> Admit:
        """Count one event; whether to log it, and whether it is the first of its kind."""
        with self._lock:
            now = self.mono()
            w = self._windows.get(key)
            if w is None and len(self._windows) >= self.max_keys:
                self._prune(now)
                if len(self._windows) >= self.max_keys:
                    key = OTHER
                    w = self._windows.get(key)
            first = (key, category) not in self._seen
            if first:
                if len(self._seen) >= self.max_keys:
                    self._seen.clear()
                self._seen.add((key, category))
            if w is not None and now - w.start >= self.window_s:
                self._close(key, w)
                w = None
            if w is None:
                w = self._windows[key] = _Window(now)
            if w.logged < self.lines or first:
                w.logged += 1
                return Admit(True, first)
            w.held[category] += 1
            return Admit(False, first)

    def due(self, force: bool = False) -> list[Summary]:
        """Summaries of the windows that are over and held events back, oldest first;
        each is returned once. ``force``: every window is over (at shutdown)."""
        with self._lock:
            now = self.mono()
            for key, w in list(self._windows.items()):
                if force or now - w.start >= self.window_s:
                    self._close(key, w)
            out, self._ready = self._ready, []
        return out

    def _close(self, key: str, w: _Window) -> None:
        del self._windows[key]
        if w.held:
            self._ready.append(Summary(key, sum(w.held.values()), dict(w.held.most_common()), self.window_s))

    def _prune(self, now: float) -> None:
        for key, w in list(self._windows.items()):
            if now - w.start >= self.window_s:
                self._close(key, w)


def summary_text(s: Summary, what: str = "failed attempts") -> str:
    """``kind email: 1234 more failed attempts in the last 60 s (ValueError 1200, ...)``."""
    parts = ", ".join(f"{cat} {n}" for cat, n in s.by_category.items())
    return f"kind {s.key}: {s.held} more {what} in the last {s.window_s:.0f} s ({parts})"
