"""The poller writes the next occurrences of recurring schedules with a Producer built from
what it holds (the keyspace's settings, its clock, its layout refresh): it reads no
environment settings, so a process whose environment would fail ``Settings.from_env``
still keeps its chains going."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from scheduler import Client
from scheduler.domain.clock import FakeClock
from scheduler.domain.dispatch import App
from scheduler.store import SchemaOptions
from tests.conftest import make_store
from tests.contract.test_poller_contract import FAST, T0_MS, drive, make_poller


def test_the_poller_writes_occurrences_without_reading_the_environment(tmp_path: Any, request: Any,
                                                                      monkeypatch: Any):
    store = make_store("sqlite", request, tmp_path, SchemaOptions(shard_count=4), now_ms=T0_MS - 60_000)
    clock = FakeClock(T0_MS)
    client = Client(store, clock=clock)
    client.recurring.create("r", kind="tick", every="5s")
    fired: list[int] = []
    poller = make_poller(store, clock, None, app=App.for_function(lambda job: fired.append(clock.now_ms())))
    # Read by Settings.from_env, and refused there (ConfigError): only a hidden read fails.
    monkeypatch.setenv("SCHEDULER_LAYOUT_CACHE_TTL_S", "not-a-number")
    try:
        drive(poller, clock, 21)
    finally:
        poller.stop()
        client.close()
        store.close()
    assert len(fired) >= 4, f"the chain stopped after {len(fired)} occurrence(s)"
    producer = poller.occurrences.producer
    assert producer.meta == poller.meta and producer.clock is clock
    assert producer.layout_cache_ttl_s == poller.config.layout_refresh_s


def test_the_occurrence_writer_takes_its_producer_settings_from_the_poller_config(tmp_path: Any,
                                                                                   request: Any):
    """A poller given ``layout_cache_ttl_s`` and ``nudge`` (as ``run_poller`` fills them from
    its Settings) writes its occurrences with them, not with a producer's defaults."""
    store = make_store("sqlite", request, tmp_path, SchemaOptions(shard_count=4), now_ms=T0_MS - 60_000)
    clock = FakeClock(T0_MS)
    client = Client(store, clock=clock)
    client.recurring.create("r", kind="tick", every="5s")
    fired: list[int] = []
    config = replace(FAST, layout_refresh_s=5.0, layout_cache_ttl_s=1.0, nudge=False)
    poller = make_poller(store, clock, None, config=config,
                         app=App.for_function(lambda job: fired.append(clock.now_ms())))
    # A TTL longer than the refresh period leaves the refresh period as the age.
    longer = make_poller(store, clock, None, shards=(),
                         config=replace(FAST, layout_refresh_s=5.0, layout_cache_ttl_s=100.0))
    try:
        drive(poller, clock, 21)
        assert longer.occurrences.producer.layout_cache_ttl_s == 5.0
        assert longer.occurrences.producer.nudger is not None
    finally:
        poller.stop()
        longer.stop()
        client.close()
        store.close()
    assert len(fired) >= 4, f"the chain stopped after {len(fired)} occurrence(s)"
    producer = poller.occurrences.producer
    assert producer.layout_cache_ttl_s == 1.0
    assert producer.nudger is None


def test_a_stopped_poller_closes_the_sockets_its_occurrence_writer_nudged_with(tmp_path: Any, request: Any):
    store = make_store("sqlite", request, tmp_path, SchemaOptions(shard_count=4), now_ms=T0_MS - 60_000)
    clock = FakeClock(T0_MS)
    poller = make_poller(store, clock, None, config=replace(FAST, nudge=True))
    try:
        nudger = poller.occurrences.producer.nudger
        assert nudger is not None
        closed: list[bool] = []
        real_close = nudger.close

        def close() -> None:
            closed.append(True)
            real_close()

        nudger.close = close  # type: ignore[method-assign]
        drive(poller, clock, 1)
    finally:
        poller.stop()
        store.close()
    assert closed == [True], "the writer's nudge sockets stayed open after the poller stopped"
