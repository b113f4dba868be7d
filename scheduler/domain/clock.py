"""Clocks, passed in so tests can step and skew time.

The wall clock decides whether a job is due; the monotonic clock measures intervals,
timeouts and rates (a wall-clock step must not stretch or shrink a sleep).
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock time, epoch milliseconds."""

    def monotonic(self) -> float:
        """Monotonic seconds, for intervals only."""

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds`` of monotonic time."""


class SystemClock:
    """The real clock, optionally skewed by ``offset_ms`` (for skew tests)."""

    def __init__(self, offset_ms: int = 0) -> None:
        self.offset_ms = offset_ms

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset_ms

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class FakeClock:
    """A manual clock: time moves only when a test calls ``advance`` or ``sleep``."""

    def __init__(self, now_ms: int = 1_800_000_000_000) -> None:
        self._now_ms = now_ms
        self._mono = 1000.0
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._now_ms

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now_ms += int(seconds * 1000)
            self._mono += seconds

    def step_wall(self, ms: int) -> None:
        """Step the wall clock only, as NTP or a VM resume would."""
        with self._lock:
            self._now_ms += ms
