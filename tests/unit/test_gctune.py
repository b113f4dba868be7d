"""``tune_gc``: the garbage collector's thresholds of a poller process."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from scheduler.domain.clock import SystemClock
from scheduler.runtime.gctune import POLLER_THRESHOLDS, tune_gc
from scheduler.store import SchemaOptions, open_store
from tests.unit.test_runner import _run_until_polling


@pytest.fixture
def thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


def test_tune_gc_sets_the_poller_thresholds_and_returns_the_previous_ones(thresholds):
    assert tune_gc() == (700, 10, 10)
    assert gc.get_threshold() == POLLER_THRESHOLDS
    assert tune_gc() == POLLER_THRESHOLDS  # again: nothing changes
    assert gc.isenabled()


def test_the_thresholds_collect_less_often_than_the_defaults():
    young, middle, old = POLLER_THRESHOLDS
    assert young > 700 and middle >= 10 and old >= 10  # never more often than the defaults


def test_run_poller_tunes_its_process(thresholds, tmp_path: Any):
    url = f"sqlite:///{tmp_path}/s.db"
    st = open_store(url)
    st.apply_schema(SchemaOptions(shard_count=2), SystemClock().now_ms())
    st.close()
    _run_until_polling(store=url, shards=[0, 1])
    assert gc.get_threshold() == POLLER_THRESHOLDS


def test_run_poller_leaves_the_thresholds_alone_when_told(thresholds, tmp_path: Any):
    url = f"sqlite:///{tmp_path}/s.db"
    st = open_store(url)
    st.apply_schema(SchemaOptions(shard_count=2), SystemClock().now_ms())
    st.close()
    _run_until_polling(store=url, shards=[0, 1], gc_thresholds=None)
    assert gc.get_threshold() == (700, 10, 10)
    _run_until_polling(store=url, shards=[0, 1], gc_thresholds=(5000, 20, 20))
    assert gc.get_threshold() == (5000, 20, 20)
