"""A token bucket on the monotonic clock. Pure: the time source is passed in.

Refilled on monotonic time so that a wall-clock step (NTP, VM resume) cannot mint
tokens: a forward step that makes a day of jobs due at once drains at the configured
rate, oldest first.
"""

from __future__ import annotations

from collections.abc import Callable


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` banked; ``rate=None`` is unlimited."""

    def __init__(self, rate: float | None, burst: float | None = None,
                 monotonic: Callable[[], float] | None = None) -> None:
        import time

        if rate is not None and rate <= 0:
            raise ValueError("rate must be positive or None")
        self.rate = rate
        self.burst = burst if burst is not None else (max(1.0, rate / 10) if rate else 0.0)
        self._mono = monotonic or time.monotonic
        self._tokens = self.burst
        self._at = self._mono()

    def _refill(self, now: float | None = None) -> None:
        if now is None:
            now = self._mono()
        elif now <= self._at:  # the same reading again (many takes), or an older one: nothing to add
            return
        if self.rate is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def try_take(self, n: float = 1.0, now: float | None = None) -> bool:
        """Take ``n`` tokens if available; never blocks. ``now``: the caller's reading of
        the bucket's monotonic clock, taken once for many calls (a reading older than the
        bucket's last refill adds nothing, so a stale one never mints tokens)."""
        if self.rate is None:
            return True
        self._refill(now)
        if self._tokens >= n:
            self._tokens -= n
            return True
        return False

    def give_back(self, n: float = 1.0) -> None:
        """Return tokens taken for work that did not go ahead after all."""
        if self.rate is not None:
            self._tokens = min(self.burst, self._tokens + n)

    def wait_s(self, n: float = 1.0) -> float:
        """Seconds until ``n`` tokens are available (0 when they are now)."""
        if self.rate is None:
            return 0.0
        self._refill()
        return max(0.0, (n - self._tokens) / self.rate)
