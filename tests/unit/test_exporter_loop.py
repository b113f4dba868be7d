"""The exporter's loops ride out any failure: a store error or an unexpected one (a bug)
sets ``up`` to 0 (refresh) or counts an audit error, is logged once per spell and kind,
and the loop goes on and recovers. A failed schedules read keeps the lag figures.
Embedded store: no server."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import generate_latest

from scheduler.domain.clock import FakeClock
from scheduler.errors import StoreUnavailable
from scheduler.observe import exporter
from scheduler.observe.exporter import LagExporter
from scheduler.store import SchemaOptions, Store, open_store

T0_MS = 1_800_000_000_000


class Records(logging.Handler):
    """The exporter logger's records, whatever the logging set-up of other tests."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def actions(self, action: str) -> list[logging.LogRecord]:
        return [r for r in self.records if getattr(r, "action", None) == action]


@pytest.fixture
def records() -> Iterator[Records]:
    logger = logging.getLogger("scheduler.exporter")
    handler, level = Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture
def store(tmp_path: Any) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path}/store.db")
    s.apply_schema(SchemaOptions(shard_count=2), T0_MS)
    yield s
    s.close()


def until(pred: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def metric(exp: LagExporter, name: str) -> float:
    for line in generate_latest(exp.registry).decode().splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no {name}")


def failing(calls: list[int], switch: threading.Event, error: Exception, real: Callable[[], Any]
            ) -> Callable[[], Any]:
    def call() -> Any:
        calls[0] += 1
        if switch.is_set():
            raise error
        return real()
    return call


ERRORS = [StoreUnavailable("the store is away"), ConnectionResetError(104, "reset")]


@pytest.mark.parametrize("error", ERRORS, ids=["store", "unexpected"])
def test_a_failing_refresh_sets_up_to_0_logs_once_and_the_loop_recovers(
        store: Store, records: Records, error: Exception) -> None:
    exp = LagExporter(store, FakeClock(T0_MS), lambda: None, interval_s=0.01)
    exp.refresh()
    assert metric(exp, "scheduler_exporter_up") == 1
    calls, switch = [0], threading.Event()
    switch.set()
    store.meta = failing(calls, switch, error, store.meta)  # type: ignore[method-assign]
    exp.start()
    try:
        until(lambda: calls[0] >= 5, "five failed refreshes")
        assert metric(exp, "scheduler_exporter_up") == 0
        switch.clear()
        until(lambda: metric(exp, "scheduler_exporter_up") == 1, "a refresh after the failures")
    finally:
        exp.stop()
    assert len(records.actions("exporter_refresh_failed")) == 1
    assert len(records.actions("exporter_refresh_ok")) == 1


@pytest.mark.parametrize("error", ERRORS, ids=["store", "unexpected"])
def test_a_failing_audit_is_counted_logged_once_and_the_loop_goes_on(
        store: Store, records: Records, error: Exception, monkeypatch: Any) -> None:
    exp = LagExporter(store, FakeClock(T0_MS), lambda: None, interval_s=3600, audit_interval_s=0.01)
    calls, switch = [0], threading.Event()
    switch.set()
    real = exporter.audit  # type: ignore[attr-defined]
    monkeypatch.setattr(exporter, "audit", lambda *a: failing(calls, switch, error, lambda: real(*a))())
    exp.start()
    try:
        until(lambda: metric(exp, "scheduler_audit_errors_total") >= 5, "five failed audits")
        switch.clear()
        until(lambda: records.actions("audit_ok") != [], "an audit after the failures")
    finally:
        exp.stop()
    assert len(records.actions("audit_failed")) == 1


def test_a_failing_schedules_read_keeps_the_lag_and_is_tried_an_interval_later(
        store: Store, records: Records) -> None:
    exp = LagExporter(store, FakeClock(T0_MS), lambda: None)
    calls, switch = [0], threading.Event()
    switch.set()
    store.list_schedules = failing(calls, switch, RuntimeError("a bug"), store.list_schedules)  # type: ignore
    exp.refresh()
    exp.refresh()
    assert calls[0] == 1, "not again before the interval"
    assert metric(exp, "scheduler_exporter_up") == 1
    assert len(records.actions("exporter_recurring_failed")) == 1


def test_a_failing_fleet_read_of_any_kind_is_logged_once_per_type_and_lag_is_read_without_it(
        store: Store, records: Records) -> None:
    errors: list[Exception] = [StoreUnavailable("zk away"), StoreUnavailable("still away"), KeyError("bug")]

    def fleet() -> Any:
        if errors:
            raise errors.pop(0)
        return None

    exp = LagExporter(store, FakeClock(T0_MS), fleet)
    for _ in range(4):
        exp.refresh()
    assert metric(exp, "scheduler_exporter_up") == 1
    assert metric(exp, "scheduler_exporter_refresh_errors_total") == 3
    failed = records.actions("exporter_fleet_failed")
    assert len(failed) == 2 and failed[1].exc_info is not None  # the store error, then the bug with its trace
    assert len(records.actions("exporter_fleet_ok")) == 1
