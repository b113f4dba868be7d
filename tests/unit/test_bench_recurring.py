"""bench.recurring's sampler: lateness counted only inside the window, and the seconds
with the latest starts reported in time order (where a p99 tail came from)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from unittest import mock

from bench.recurring import Sampler


def job(nominal_s: float) -> Any:
    return mock.Mock(scheduled_for=datetime.fromtimestamp(nominal_s, UTC), due_ms=0)


def test_the_worst_seconds_are_the_latest_starts_in_time_order() -> None:
    s = Sampler()
    s.window = (1000.0, 1010.0)
    starts = {1000.5: 1000.45, 1003.2: 1001.0, 1003.9: 1003.8, 1007.1: 1007.0, 1012.0: 1011.9}
    for now, nominal in starts.items():
        with mock.patch("bench.recurring.time.time", return_value=now):
            s(job(nominal))
    assert s.total == 5 and len(s.samples) == 4  # the start at 1012 is after the window
    assert s.worst_seconds(2) == [{"second": 3, "starts": 2, "max_ms": 2200.0},
                                  {"second": 7, "starts": 1, "max_ms": 100.0}]
