"""Recurring rules: parsing, nominal times, and the DST rule (Debian cron's, as cronsim
follows it) in two zones, both directions, for fixed-time and hourly rules."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest

from scheduler.domain.keys import from_ms, to_ms
from scheduler.errors import InvalidInput
from scheduler.recurring.rule import Rule, parse_duration


def local(ms: list[int], tz: str) -> list[str]:
    return [from_ms(t).astimezone(ZoneInfo(tz)).isoformat() for t in ms]


def ms(*args: int, tz: str = "UTC") -> int:
    return to_ms(datetime(*args, tzinfo=ZoneInfo(tz)))  # type: ignore[arg-type, misc]


# Berlin: back 2026-10-25 03:00 CEST -> 02:00 CET; forward 2026-03-29 02:00 -> 03:00.
# New York: back 2026-11-01 02:00 EDT -> 01:00 EST; forward 2026-03-08 02:00 -> 03:00.
@pytest.mark.parametrize("tz,day,at", [("Europe/Berlin", (2026, 10, 24), "30 2 * * *"),
                                       ("America/New_York", (2026, 10, 31), "30 1 * * *")])
def test_a_fixed_local_time_fires_once_when_the_clocks_go_back(tz, day, at):
    """kubernetes/kubernetes#121594, temporalio/temporal#8205: doubled runs."""
    rule = Rule.parse(cron=at, tz=tz)
    times = local(rule.times(ms(*day, tz=tz), 3), tz)
    hh = at.split()[1].zfill(2)
    assert [t[11:16] for t in times] == [f"{hh}:30"] * 3, "once a day, the first instant"
    assert len({t[:10] for t in times}) == 3


@pytest.mark.parametrize("tz,day,expect", [
    ("Europe/Berlin", (2026, 3, 28), ["2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00",
                                      "2026-03-30T02:30:00+02:00"]),
    ("America/New_York", (2026, 3, 7), ["2026-03-07T02:30:00-05:00", "2026-03-08T03:00:00-04:00",
                                        "2026-03-09T02:30:00-04:00"]),
])
def test_a_fixed_local_time_fires_at_the_change_when_the_clocks_go_forward(tz, day, expect):
    rule = Rule.parse(cron="30 2 * * *", tz=tz)
    assert local(rule.times(ms(*day, tz=tz), 3), tz) == expect


@pytest.mark.parametrize("tz,start", [("Europe/Berlin", (2026, 10, 25, 0, 30)),
                                      ("America/New_York", (2026, 11, 1, 0, 30)),
                                      ("Europe/Berlin", (2026, 3, 29, 0, 30)),
                                      ("America/New_York", (2026, 3, 8, 0, 30))])
def test_hourly_fires_at_every_real_hour_across_either_change(tz, start):
    rule = Rule.parse(cron="@hourly", tz=tz)
    times = rule.times(ms(*start, tz=tz), 5)
    assert [b - a for a, b in pairwise(times)] == [3_600_000] * 4


def test_intervals_are_anchored_at_the_start_and_never_drift():
    """scylladb/scylla-manager#4310: the next time comes from the previous nominal time."""
    anchor = ms(2026, 1, 1, 0, 0, 7)
    rule = Rule.parse(every="5m", anchor_ms=anchor)
    assert rule.after(anchor - 1) == anchor
    assert rule.after(anchor) == anchor + 300_000
    assert rule.after(anchor + 299_999) == anchor + 300_000
    late = anchor + 3 * 300_000 + 12_345  # however late a run completes
    assert (rule.after(late) - anchor) % 300_000 == 0
    assert rule.back(late) == anchor + 3 * 300_000 and rule.back(late, 2) == anchor + 2 * 300_000
    assert rule.back(anchor - 1) is None and rule.back(anchor + 1, 2) is None


def test_cron_walks_back():
    rule = Rule.parse(cron="30 2 * * *", tz="Europe/Berlin")
    t = ms(2026, 10, 26, 2, 30, tz="Europe/Berlin")
    assert rule.back(t) == t, "at or before"
    assert local([rule.back(t - 1) or 0, rule.back(t, 3) or 0], "Europe/Berlin") == [
        "2026-10-25T02:30:00+02:00", "2026-10-24T02:30:00+02:00"]


def test_aliases_and_zones():
    assert Rule.parse(cron="@daily").expression == "0 0 * * *"
    assert Rule.parse(cron="@weekly", tz="Europe/Lisbon").after(ms(2026, 12, 1)) == ms(
        2026, 12, 6, tz="Europe/Lisbon")
    assert Rule.parse(cron=" */15   * * * * ").cron == "*/15 * * * *"
    assert from_ms(Rule.parse(cron="@yearly").after(ms(2026, 6, 1))) == datetime(2027, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("kwargs,message", [
    ({"cron": "61 * * * *"}, "Bad minute"),
    ({"cron": "0 0 30 2 *"}, "Bad day-of-month"),
    ({"cron": "* * * *"}, "has 4 fields"),
    ({"cron": "0 * * * * *"}, "has 6 fields"),
    ({"cron": "@often"}, "alias '@often' is unknown"),
    ({"cron": "* * * * *", "tz": "Mars/Olympus"}, "unknown time zone"),
    ({"every": "0s"}, "longer than zero"),
    ({"every": "5 minutes"}, "not a duration"),
    ({"every": "400d"}, "between 1s and 366d"),
    ({}, "exactly one of --cron"),
    ({"cron": "* * * * *", "every": "5m"}, "exactly one of --cron"),
])
def test_bad_rules_say_what_is_wrong(kwargs, message):
    with pytest.raises(InvalidInput, match=message):
        Rule.parse(**kwargs)


def test_durations():
    assert [parse_duration(x) for x in ("90s", "5m", "12h", "7d")] == [90, 300, 43200, 604800]
    assert parse_duration("0s", allow_zero=True) == 0


def test_durations_share_the_syntax_of_every_flag():
    assert parse_duration("90") == 90 and parse_duration(" 2d ") == 172_800
    for bad in ("1.5m", "-5s", "1e3", "nan", "5 minutes"):
        with pytest.raises(InvalidInput, match="not a duration"):
            parse_duration(bad, "--every")


@pytest.mark.parametrize("value", [True, 1.5, -1, None])
def test_a_duration_given_as_a_number_must_be_whole_seconds(value):
    from scheduler.producer.recurring import _seconds

    with pytest.raises(InvalidInput):
        _seconds(value, "--jitter", allow_zero=True)
    with pytest.raises(InvalidInput, match="--every"):
        Rule.parse(every=value if value is not None else True)
