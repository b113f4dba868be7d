"""Flow control's rows in both stores (``scheduler.store.flow``): limits and pauses per
kind, the pollers' demand, bad input refused with nothing written, and the upgrade of a
v005 store."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.domain.flow import Demand, Limits
from scheduler.errors import InvalidInput, SchemaError
from scheduler.store import SchemaOptions, Store
from scheduler.store.base import SCHEMA_VERSION
from scheduler.store.flow import DEMAND_TTL_S
from tests.conftest import make_store

T0_MS = 1_800_000_000_000


def test_limits_round_trip_in_kind_order(store: Store):
    assert store.flow_limits() == []
    store.set_limits("sms", 2.5, 10, None, None, T0_MS)
    store.set_limits("email", 100.0, 50, 8, 2, T0_MS + 1)
    assert store.flow_limits() == [
        Limits("email", 100.0, 50, 8, 2, False),
        Limits("sms", 2.5, 10, None, None, False),
    ]


def test_set_writes_only_the_fields_given_and_keeps_the_pause(store: Store):
    store.set_limits("email", 10.0, 20, 5, None, T0_MS)
    store.set_paused("email", True, T0_MS + 1)
    store.set_limits("email", None, None, 7, 3, T0_MS + 2)
    assert store.flow_limits() == [Limits("email", 10.0, 20, 7, 3, True)]
    store.set_limits("email", 1, None, None, None, T0_MS + 3)  # an int rate is a rate
    assert store.flow_limits()[0].rate_per_s == 1.0


def test_a_set_with_no_field_writes_nothing(store: Store):
    store.set_limits("email", None, None, None, None, T0_MS)
    assert store.flow_limits() == []
    store.set_limits("email", 3.0, None, None, None, T0_MS)
    store.set_limits("email", None, None, None, None, T0_MS + 5)
    assert store.flow_limits() == [Limits("email", 3.0)]


def test_clear_removes_the_limits_and_keeps_a_pause(store: Store):
    store.set_limits("email", 10.0, 20, 5, 1, T0_MS)
    store.set_limits("sms", 1.0, None, None, None, T0_MS)
    store.set_paused("email", True, T0_MS + 1)
    store.clear_limits("email")
    store.clear_limits("email")  # idempotent
    [email, sms] = store.flow_limits()
    assert (email.kind, email.paused, email.rate_per_s, email.burst, email.concurrency,
            email.per_key_concurrency) == ("email", True, None, None, None, None)
    assert sms == Limits("sms", 1.0)
    store.clear_limits("sms")
    store.clear_limits("never-set")
    assert [f.kind for f in store.flow_limits()] == ["email"]


def test_pause_and_resume_keep_the_limits(store: Store):
    store.set_limits("email", 10.0, None, None, None, T0_MS)
    store.set_paused("email", True, T0_MS + 1)
    store.set_paused("email", True, T0_MS + 1)  # idempotent
    assert store.flow_limits() == [Limits("email", 10.0, paused=True)]
    store.set_paused("email", False, T0_MS + 2)
    assert store.flow_limits() == [Limits("email", 10.0)]
    # A pause alone is a row; resumed with no limit, the kind has no row at all.
    store.set_paused("sms", True, T0_MS + 3)
    assert [(f.kind, f.paused) for f in store.flow_limits()] == [("email", False), ("sms", True)]
    store.set_paused("sms", False, T0_MS + 4)
    store.set_paused("push", False, T0_MS + 4)
    assert [f.kind for f in store.flow_limits()] == ["email"]


def test_demand_round_trip_and_freshness(store: Store):
    store.publish_demand("p1", [("email", 500, 4), ("sms", 0, 0)], T0_MS)
    store.publish_demand("p2", [("email", 12, 1)], T0_MS + 500)
    assert store.demands(T0_MS + 1_000, 5_000) == [
        Demand("p1", "email", 500, 4, T0_MS), Demand("p1", "sms", 0, 0, T0_MS),
        Demand("p2", "email", 12, 1, T0_MS + 500)]
    # Older than the reader's max age: dropped (p1's rows are 1.2 s old, p2's 0.7 s).
    assert [(d.poller, d.kind) for d in store.demands(T0_MS + 1_200, 1_000)] == [("p2", "email")]
    # A new report replaces the poller's rows of the kinds it names; the kind it no
    # longer names keeps its old time and ages out.
    store.publish_demand("p1", [("email", 480, 5)], T0_MS + 1_000)
    store.publish_demand("p1", [("email", 480, 5)], T0_MS + 1_000)  # idempotent
    assert store.demands(T0_MS + 1_500, 1_000) == [
        Demand("p1", "email", 480, 5, T0_MS + 1_000), Demand("p2", "email", 12, 1, T0_MS + 500)]
    store.publish_demand("p1", [], T0_MS + 1_100)  # nothing to say: nothing written
    assert [d.at_ms for d in store.demands(T0_MS + 1_500, 10_000)] == [T0_MS + 1_000, T0_MS, T0_MS + 500]


def test_published_parts_and_slots_round_trip(store: Store):
    store.publish_demand("p1", [("email", 5, 2, 12.5, 3), ("sms", 1, 0, None, 4), ("push", 1, 0, 2.0)],
                         T0_MS)
    assert store.demands(T0_MS, 1_000) == [
        Demand("p1", "email", 5, 2, T0_MS, 12.5, 3), Demand("p1", "push", 1, 0, T0_MS, 2.0, None),
        Demand("p1", "sms", 1, 0, T0_MS, None, 4)]


def test_a_demand_from_a_clock_far_ahead_is_not_fresh(store: Store):
    """The domain's ``fresh`` in both stores: a row more than the max age after the
    reader's now (its poller's clock runs ahead) is left out, as a stale one is."""
    store.publish_demand("ahead", [("email", 3, 0)], T0_MS + 60_000)
    store.publish_demand("here", [("email", 2, 1)], T0_MS)
    assert store.demands(T0_MS + 1_000, 5_000) == [Demand("here", "email", 2, 1, T0_MS)]
    assert [d.poller for d in store.demands(T0_MS + 58_000, 5_000)] == ["ahead"]


def test_demand_rows_expire_without_a_reader_filter(store: Store, store_kind: str):
    """A killed poller's rows vanish: Cassandra writes them with a TTL; the embedded
    store purges them at the next publish of any poller."""
    store.publish_demand("dead", [("email", 9, 9)], T0_MS)
    if store_kind == "cassandra":
        ks = store.keyspace  # type: ignore[attr-defined]
        [(ttl,)] = store.session.execute(  # type: ignore[attr-defined]
            f"SELECT TTL(demand) FROM {ks}.flow_demand WHERE scope = 0")
        assert 0 < ttl <= DEMAND_TTL_S
    else:
        store.publish_demand("live", [("email", 1, 0)], T0_MS + DEMAND_TTL_S * 1000 + 1)
        assert [d.poller for d in store.demands(T0_MS, 10**12)] == ["live"]


def test_the_async_door_reaches_the_flow_rows(store: Store):
    store.set_limits("email", 5.0, None, None, None, T0_MS)

    async def read() -> Any:
        return await store.acall("flow_limits"), await store.acall("demands", T0_MS, 1_000)

    assert asyncio.run(read()) == ([Limits("email", 5.0)], [])


BAD_CALLS: list[tuple[str, tuple[Any, ...]]] = [
    ("set_limits", ("", 1.0, None, None, None, T0_MS)),
    ("set_limits", ("bad kind!", 1.0, None, None, None, T0_MS)),
    ("set_limits", (None, 1.0, None, None, None, T0_MS)),
    ("set_limits", ("email", 0.0, None, None, None, T0_MS)),
    ("set_limits", ("email", -1.0, None, None, None, T0_MS)),
    ("set_limits", ("email", math.nan, None, None, None, T0_MS)),
    ("set_limits", ("email", math.inf, None, None, None, T0_MS)),
    ("set_limits", ("email", "5/s", None, None, None, T0_MS)),
    ("set_limits", ("email", True, None, None, None, T0_MS)),
    ("set_limits", ("email", 1.0, 0, None, None, T0_MS)),
    ("set_limits", ("email", 1.0, None, 2**31, None, T0_MS)),
    ("set_limits", ("email", 1.0, None, None, -1, T0_MS)),
    ("set_limits", ("email", 1.0, None, 1.5, None, T0_MS)),
    ("set_limits", ("email", 1.0, False, None, None, T0_MS)),
    ("set_limits", ("email", 1.0, None, None, None, None)),
    # The domain's bounds (domain.flow): below one a day, above 1e9.
    ("set_limits", ("email", 1e-6, None, None, None, T0_MS)),
    ("set_limits", ("email", 2e9, None, None, None, T0_MS)),
    ("set_limits", ("email", None, None, 10**9 + 1, None, T0_MS)),
    ("set_paused", ("email", 1, T0_MS)),
    ("set_paused", ("email", None, T0_MS)),
    ("set_paused", ("x" * 65, True, T0_MS)),
    ("clear_limits", ("",)),
    ("publish_demand", ("", [("email", 1, 1)], T0_MS)),
    ("publish_demand", ("p" * 257, [("email", 1, 1)], T0_MS)),
    ("publish_demand", ("p\ud800", [("email", 1, 1)], T0_MS)),
    ("publish_demand", ("p", [("email", 1, 1), ("bad kind", 1, 1)], T0_MS)),
    ("publish_demand", ("p", [("email", 1, 1), ("email", 2, 2)], T0_MS)),
    ("publish_demand", ("p", [("email", -1, 0)], T0_MS)),
    ("publish_demand", ("p", [("email", 1, None)], T0_MS)),
    ("publish_demand", ("p", [("email", 1)], T0_MS)),
    ("publish_demand", ("p", [("email", 1, 1, 1.0, -1)], T0_MS)),
    ("publish_demand", ("p", [("email", 1, 1, 1.0, 1.5)], T0_MS)),
    ("publish_demand", ("p", [("email", 1, 1, 1.0, 2, 3)], T0_MS)),
    ("publish_demand", ("p", "email", T0_MS)),
    ("publish_demand", ("p", [("email", 1, 1)], -1)),
    ("demands", (T0_MS, -1)),
    ("demands", (None, 1_000)),
]


def test_bad_input_is_invalid_input_and_writes_nothing(store: Store):
    # One store for every case (a Cassandra keyspace per case would cost seconds each).
    store.set_limits("email", 3.0, 4, None, None, T0_MS)
    store.publish_demand("p", [("email", 7, 1)], T0_MS)
    before = store.flow_limits(), store.demands(T0_MS, 1_000)
    for method, args in BAD_CALLS:
        with pytest.raises(InvalidInput):
            getattr(store, method)(*args)
        assert (store.flow_limits(), store.demands(T0_MS, 1_000)) == before, (method, args)


values = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**40, max_value=2**40),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=70))


@pytest.mark.fuzz
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kind=st.one_of(st.sampled_from(["email", "sms"]), values), rate=values, burst=values,
       conc=values, per_key=values, paused=values)
def test_any_limit_values_are_written_whole_or_refused_with_nothing_written(
        store: Store, kind: Any, rate: Any, burst: Any, conc: Any, per_key: Any, paused: Any):
    before = store.flow_limits()
    try:
        store.set_limits(kind, rate, burst, conc, per_key, T0_MS)
    except InvalidInput:
        assert store.flow_limits() == before
    else:
        [row] = [f for f in store.flow_limits() if f.kind == kind] or [Limits(kind)]
        for field, value in (("rate_per_s", rate), ("burst", burst), ("concurrency", conc),
                             ("per_key_concurrency", per_key)):
            if value is not None:
                assert getattr(row, field) == value
    before = store.flow_limits()
    try:
        store.set_paused(kind, paused, T0_MS)
    except InvalidInput:
        assert store.flow_limits() == before
    else:
        assert any(f.kind == kind and f.paused for f in store.flow_limits()) == paused


def test_a_v005_store_refuses_flow_rows_until_upgraded(store_kind, request, tmp_path):
    st5 = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=4, upto=5), now_ms=T0_MS)
    try:
        assert st5.meta().schema_version == 5
        for method, args in [("flow_limits", ()), ("demands", (T0_MS, 1_000)),
                             ("set_limits", ("email", 1.0, None, None, None, T0_MS)),
                             ("set_paused", ("email", True, T0_MS)), ("clear_limits", ("email",)),
                             ("publish_demand", ("p", [("email", 1, 1)], T0_MS))]:
            with pytest.raises(SchemaError, match="schema apply"):
                getattr(st5, method)(*args)
        res = st5.apply_schema(SchemaOptions(shard_count=4), T0_MS + 1_000)
        assert (res.from_version, res.to_version, res.created) == (5, SCHEMA_VERSION, False)
        assert st5.meta().schema_version == SCHEMA_VERSION
        assert st5.flow_limits() == [] and st5.demands(T0_MS, 1_000) == []
        st5.set_limits("email", 1.0, None, None, None, T0_MS)
        assert st5.flow_limits() == [Limits("email", 1.0)]
    finally:
        st5.close()
