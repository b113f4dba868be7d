"""Flow-control rows written past the store's checks (by hand, by another tool) never
stop the pollers' reads: bad values read as no such limit, bad demand rows are skipped."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from scheduler.domain.clock import SystemClock
from scheduler.store import SchemaOptions, open_store


@pytest.fixture
def store(tmp_path: Any):
    st = open_store(f"sqlite:///{tmp_path}/s.db")
    st.apply_schema(SchemaOptions(shard_count=2), SystemClock().now_ms())
    yield st, tmp_path / "s.db"
    st.close()


@pytest.mark.parametrize("rate, burst, conc", [
    ("abc", "x", "y"), (float("inf"), 5, 5), (float("nan"), None, None), (1e-300, None, -3),
    (-5.0, 2**62, 0), (b"\x00", 1.5, True)])
def test_bad_stored_limits_read_as_no_such_limit(store, rate, burst, conc):
    st, path = store
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO flow_limits (kind, rate_per_s, burst, concurrency, per_key_concurrency,"
                   " paused, updated_ms) VALUES (?, ?, ?, ?, NULL, 1, 0)", ("k", rate, burst, conc))
    (lim,) = st.flow_limits()
    assert lim.paused
    assert lim.rate_per_s is None or 0 < lim.rate_per_s < float("inf")
    assert lim.burst is None or (isinstance(lim.burst, int) and lim.burst >= 1)
    assert lim.concurrency is None or (isinstance(lim.concurrency, int) and lim.concurrency >= 1)
    assert lim.effective_burst >= 0  # arithmetic on what was read does not raise


def test_bad_demand_rows_are_skipped(store):
    st, path = store
    now = SystemClock().now_ms()
    st.publish_demand("good", [("k", 3, 1, 2.5)], now)
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO flow_demand (poller, kind, demand, running, at_ms, part)"
                   " VALUES ('bad', 'k', 'abc', 1, ?, 'x')", (now,))
        db.execute("INSERT INTO flow_demand (poller, kind, demand, running, at_ms, part, slots)"
                   " VALUES ('inf', 'k', 4, 1, ?, 1e999, -3)", (now,))
        db.execute("INSERT INTO flow_demand (poller, kind, demand, running, at_ms, part, slots)"
                   " VALUES ('text', 'k', 5, 1, ?, 1.0, 'x')", (now,))
    rows = st.demands(now, 3000)
    assert [(r.poller, r.demand, r.part, r.slots) for r in rows] == [
        ("good", 3, 2.5, None), ("inf", 4, None, None), ("text", 5, 1.0, None)]


def test_a_store_before_v009_refuses_a_published_part_naming_schema_apply(tmp_path):
    from scheduler.errors import SchemaError

    st = open_store(f"sqlite:///{tmp_path}/old.db")
    try:
        st.apply_schema(SchemaOptions(shard_count=2, upto=8), SystemClock().now_ms())
        now = SystemClock().now_ms()
        with pytest.raises(SchemaError, match="schema apply"):
            st.publish_demand("p", [("k", 1, 0, 1.0, 2)], now)
        with pytest.raises(SchemaError, match="schema apply"):
            st.demands(now, 3000)
    finally:
        st.close()


def test_a_stored_kind_the_store_would_refuse_is_skipped(store):
    st, path = store
    with sqlite3.connect(path) as db:
        for kind in ("bad kind", "", "x" * 65, "<script>"):
            db.execute("INSERT INTO flow_limits (kind, rate_per_s, burst, concurrency, per_key_concurrency,"
                       " paused, updated_ms) VALUES (?, 5.0, NULL, NULL, NULL, 0, 0)", (kind,))
    st.set_limits("good", 5.0, None, None, None, SystemClock().now_ms())
    assert [lim.kind for lim in st.flow_limits()] == ["good"], "no poller could publish the others"
