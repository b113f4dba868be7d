"""The fault tests' own measures (``tests/faultload.py``)."""

from __future__ import annotations

from tests.faultload import worst_inversion


def test_worst_inversion_counts_only_jobs_started_apart():
    # (fired_ms, due_ms): oldest first, then a swap within one hand-out, then a real one.
    assert worst_inversion([(100, 1), (101, 2), (102, 3)], 50) == 0
    assert worst_inversion([(100, 24_000), (101, 100)], 50) == 0  # started together
    assert worst_inversion([(100, 24_000), (101, 100)], 0) == 23_900
    assert worst_inversion([(100, 24_000), (200, 100)], 50) == 23_900  # started 100 ms later
    assert worst_inversion([], 50) == 0
