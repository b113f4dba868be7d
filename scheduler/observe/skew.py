"""Clock skew between a poller and its store. Pure arithmetic plus one store read.

The wall clock decides when a job is due, so a poller whose clock runs ahead of the
store's would fire early by the store's account, and one behind would let producers'
late writes land behind its cursor. The late-write margin assumes at most ``max_skew``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..domain.clock import Clock
from ..store.roles import Meta


@dataclass(frozen=True)
class SkewReading:
    skew_ms: int  # store clock minus ours, at the midpoint of the round trip
    certain_ms: int  # how much of |skew| the round trip cannot explain

    def exceeds(self, max_skew_ms: int) -> bool:
        return self.certain_ms > max_skew_ms


def measure(clock: Clock, store: Meta) -> SkewReading:
    """One reading: ``store.server_now_ms()`` against our clock around it."""
    t0 = clock.now_ms()
    server = store.server_now_ms()
    t1 = clock.now_ms()
    skew = server - (t0 + t1) // 2
    # The round trip bounds how well we know the skew; only what is certain counts.
    return SkewReading(skew, max(0, abs(skew) - (t1 - t0) // 2))
