"""Fault logging and back-off: one line per outage, summaries, the end."""

from __future__ import annotations

import logging

import pytest

from scheduler.observe.faults import Backoff, FaultLog, RateLimitFilter


class Tick:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_an_outage_is_logged_once_then_summarised_then_ended(caplog: pytest.LogCaptureFixture) -> None:
    tick = Tick()
    fault = FaultLog(logging.getLogger("t.faults"), "the store", action="store", monotonic=tick)
    caplog.set_level(logging.INFO, "t.faults")
    fault.ok()
    assert not caplog.records and not fault.failing
    for _ in range(1000):  # one second of a tight retry loop
        fault.failed("no host")
        tick.t += 0.001
    assert [r.action for r in caplog.records] == ["store_failing"]  # type: ignore[attr-defined]
    tick.t += 30
    fault.failed("no host")
    assert caplog.records[-1].action == "store_still_failing"  # type: ignore[attr-defined]
    assert caplog.records[-1].failures == 1000  # type: ignore[attr-defined]
    assert fault.failing_for() == pytest.approx(31.0, abs=0.01)
    fault.ok()
    assert caplog.records[-1].action == "store_recovered"  # type: ignore[attr-defined]
    assert len(caplog.records) == 3
    assert fault.failing_for() == 0 and fault.spells == 1


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    b = Backoff(first=0.1, cap=0.5)
    assert [b.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    b.reset()
    assert b.next() == 0.1


def test_rate_limit_filter_holds_back_repeats_and_counts_them() -> None:
    tick = Tick()
    f = RateLimitFilter(every_s=30, monotonic=tick)

    def rec(msg: str) -> logging.LogRecord:
        return logging.LogRecord("cassandra.pool", logging.WARNING, "", 0, msg, (), None)

    assert f.filter(rec("retry in %s"))
    assert not any(f.filter(rec("retry in %s")) for _ in range(50))
    assert f.filter(rec("another line"))
    tick.t += 31
    r = rec("retry in %s")
    assert f.filter(r)
    assert "50 similar lines held back" in str(r.msg)
