"""The poller writes the next occurrences of recurring schedules with a Producer built from
what it holds (the keyspace's settings, its clock, its layout refresh): it reads no
environment settings, so a process whose environment would fail ``Settings.from_env``
still keeps its chains going."""

from __future__ import annotations

from typing import Any

from scheduler import Client
from scheduler.domain.clock import FakeClock
from scheduler.domain.dispatch import App
from scheduler.store import SchemaOptions
from tests.conftest import make_store
from tests.contract.test_poller_contract import T0_MS, drive, make_poller


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
