"""The retention rules: durations, TTLs, and the last expiry Cassandra can store."""

from __future__ import annotations

import pytest

from scheduler.domain.retention import (
    MAX_EXPIRY_MS,
    MAX_TTL_S,
    Retention,
    check_expiry,
    format_duration,
    ttl_s,
)
from scheduler.errors import InvalidInput

NOW = 1_800_000_000_000


def test_format_is_the_shortest_exact_form():
    assert [format_duration(s) for s in (604_800, 43_200, 300, 90)] == ["7d", "12h", "5m", "90s"]


def test_ttl_ends_at_the_expiry_and_is_never_zero():
    assert ttl_s(NOW + 10_001, NOW) == 11
    assert ttl_s(NOW - 5_000, NOW) == 1  # already past: expires at once (0 would mean never)
    assert ttl_s(NOW + 10**15, NOW) == MAX_TTL_S


def test_expiries_of_each_event():
    r = Retention(jobs_s=60, dead_s=600)
    assert r.after_fire_ms(NOW) == NOW + 60_000 and r.after_event_ms(NOW) == NOW + 60_000
    assert r.dead_lookup_ms(NOW) == NOW + 600_000 == r.dead_letter_ms(NOW)
    assert Retention(jobs_s=60).gc_grace_s == 60 and Retention().gc_grace_s == 3 * 3600


def test_jobs_whose_rows_cannot_expire_are_refused():
    r = Retention()
    check_expiry(MAX_EXPIRY_MS - r.jobs_s * 1000, r, NOW)
    with pytest.raises(InvalidInput, match="schedule it before 2038-01-12"):
        check_expiry(MAX_EXPIRY_MS - r.jobs_s * 1000 + 1, r, NOW)
    late_now = MAX_EXPIRY_MS - 10 * 86_400_000 - MAX_TTL_S * 1000  # the 20-year cap binds first
    with pytest.raises(InvalidInput, match="too far ahead"):
        check_expiry(late_now + MAX_TTL_S * 1000, r, late_now)
