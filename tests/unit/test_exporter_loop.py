"""The exporter's refresh loop rides out any failure of a refresh: a store error or an
unexpected one (a bug) sets ``up`` to 0, is logged once per spell, and the loop goes on
and recovers. Embedded store: no server."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import generate_latest

from scheduler.domain.clock import FakeClock
from scheduler.errors import StoreUnavailable
from scheduler.observe.exporter import LagExporter
from scheduler.store import SchemaOptions, open_store

T0_MS = 1_800_000_000_000


def until(pred: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def up(exp: LagExporter) -> float:
    for line in generate_latest(exp.registry).decode().splitlines():
        if line.startswith("scheduler_exporter_up "):
            return float(line.split()[1])
    raise AssertionError("no scheduler_exporter_up")


@pytest.mark.parametrize("error", [StoreUnavailable("the store is away"), ConnectionResetError(104, "reset")])
def test_a_failing_refresh_sets_up_to_0_logs_once_and_the_loop_recovers(tmp_path: Any, caplog: Any,
                                                                        error: Exception) -> None:
    store = open_store(f"sqlite:///{tmp_path}/store.db")
    store.apply_schema(SchemaOptions(shard_count=2), T0_MS)
    exp = LagExporter(store, FakeClock(T0_MS), lambda: None, interval_s=0.01)
    exp.refresh()
    assert up(exp) == 1
    real_meta, calls, failing = store.meta, [0], threading.Event()
    failing.set()

    def meta() -> Any:
        calls[0] += 1
        if failing.is_set():
            raise error
        return real_meta()

    store.meta = meta  # type: ignore[method-assign]
    caplog.set_level(logging.INFO, logger="scheduler")
    exp.start()
    try:
        until(lambda: calls[0] >= 5, "five failed refreshes")
        assert up(exp) == 0
        failing.clear()
        until(lambda: up(exp) == 1, "a refresh after the failures")
    finally:
        exp.stop()
        store.close()
    failed = [r for r in caplog.records if getattr(r, "action", None) == "exporter_refresh_failed"]
    assert len(failed) == 1, [r.getMessage() for r in failed]
    assert [r for r in caplog.records if getattr(r, "action", None) == "exporter_refresh_ok"]
