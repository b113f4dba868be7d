"""The rate limiter of failure logs (``scheduler.observe.logdigest``), on an injected clock."""

from __future__ import annotations

import pytest

from scheduler.domain.clock import FakeClock
from scheduler.observe.logdigest import OTHER, Admit, LogDigest, Summary, summary_text


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_the_first_lines_per_key_are_logged_then_counted_by_category(clock: FakeClock) -> None:
    d = LogDigest(lines=3, window_s=60, monotonic=clock.monotonic)
    decisions = [d.admit("email", "ValueError") for _ in range(5)]
    assert [a.log for a in decisions] == [True, True, True, False, False]
    assert [a.first for a in decisions] == [True, False, False, False, False]
    assert d.admit("email", "TimeoutError") == Admit(True, True), "a new type: logged, over the limit too"
    assert d.admit("email", "TimeoutError") == Admit(False, False)
    assert d.admit("sms", "ValueError") == Admit(True, True), "another kind has its own limit"
    assert d.due() == [], "the window is not over"


def test_a_storm_becomes_one_summary_per_window(clock: FakeClock) -> None:
    d = LogDigest(lines=2, window_s=60, monotonic=clock.monotonic)
    logged = 0
    storm = ["ValueError"] * 2 + ["TimeoutError"]
    storm += ["TimeoutError" if i % 36 == 35 else "ValueError" for i in range(1234)]
    for error_type in storm:
        logged += d.admit("email", error_type).log
        clock.advance(0.01)
    assert logged == 3, "two lines, and the first TimeoutError"
    clock.advance(60)
    [s] = d.due()
    assert s == Summary("email", 1234, {"ValueError": 1200, "TimeoutError": 34}, 60)
    assert summary_text(s) == ("kind email: 1234 more failed attempts in the last 60 s "
                               "(ValueError 1200, TimeoutError 34)")
    assert d.due() == [], "each summary once"
    assert d.admit("email", "ValueError").log, "a new window logs again"


def test_a_window_ended_by_the_next_event_keeps_its_summary(clock: FakeClock) -> None:
    d = LogDigest(lines=1, window_s=10, monotonic=clock.monotonic)
    d.admit("k", "E")
    d.admit("k", "E")
    clock.advance(11)
    assert d.admit("k", "E").log, "the new window's first line"
    assert d.due() == [Summary("k", 1, {"E": 1}, 10)]


def test_nothing_held_back_means_no_summary_and_force_ends_every_window(clock: FakeClock) -> None:
    d = LogDigest(lines=2, window_s=60, monotonic=clock.monotonic)
    d.admit("a", "E")
    clock.advance(61)
    assert d.due() == []
    for _ in range(3):
        d.admit("b", "E")
    assert d.due() == []
    assert d.due(force=True) == [Summary("b", 1, {"E": 1}, 60)]


def test_keys_beyond_the_limit_share_one_window(clock: FakeClock) -> None:
    d = LogDigest(lines=1, window_s=60, monotonic=clock.monotonic, max_keys=2)
    assert d.admit("a", "E").log and d.admit("b", "E").log
    assert d.admit("c", "E").log, "the shared window's first line"
    assert not d.admit("d", "E").log
    assert {s.key for s in d.due(force=True)} == {OTHER}


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        LogDigest(window_s=0)
