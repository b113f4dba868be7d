"""The garbage collector's thresholds of a poller process (``runtime.gctune``)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler import run_poller
from scheduler.errors import ConfigError
from scheduler.runtime.gctune import POLLER_THRESHOLDS, thresholds, tune_gc
from scheduler.settings import Settings
from tests.procs import wait_until
from tests.unit.test_runner import _store

DEFAULTS = (700, 10, 10)


@pytest.fixture
def pinned() -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(*DEFAULTS)
    yield
    gc.set_threshold(*saved)


def test_tune_gc_sets_them_and_returns_the_previous_ones(pinned):
    assert tune_gc() == DEFAULTS
    assert gc.get_threshold()[:2] == POLLER_THRESHOLDS[:2]
    assert gc.isenabled()


@pytest.mark.parametrize(("text", "want"), [("poller", POLLER_THRESHOLDS), (" Poller ", POLLER_THRESHOLDS),
                                            ("keep", None), ("5000,20,20", (5000, 20, 20)),
                                            ((1, 0, 0), (1, 0, 0))])
def test_thresholds_accepts(text, want):
    assert thresholds(text) == want


@pytest.mark.parametrize("bad", ["", "off", "0,10,10", "10,-1,10", "1,2", "1,2,3,4", "a,b,c", "1e4,10,10",
                                 "99999999999999999999,1,1", "1,2,99999999999999999999", "1000000001,1,1",
                                 "\u0663,1,1", "1_0,1,1", "</script>", "1,2,3\n4",
                                 (0, 10, 10), (10, 10), (1, 2, 2**40), (1.5, 2, 3)])
def test_thresholds_refuses_with_one_line_naming_the_setting(bad):
    with pytest.raises(ConfigError, match="SCHEDULER_GC_THRESHOLDS") as err:
        thresholds(bad)
    assert "\n" not in str(err.value)
    assert repr(str(bad)[:40]) in str(err.value)  # what was given, not what it became


@given(st.one_of(st.text(max_size=60),
               st.builds(lambda a, b, c: f"{a},{b},{c}", *[st.integers(-5, 2**70)] * 3)))
def test_any_text_is_a_value_or_a_config_error(text):
    try:
        got = thresholds(text)
    except ConfigError:
        return
    assert got is None or (len(got) == 3 and got[0] >= 1 and min(got) >= 0)
    if got is not None:
        saved = gc.get_threshold()
        try:
            tune_gc(got)  # the collector takes whatever was accepted
        finally:
            gc.set_threshold(*saved)


def _thresholds_while_running(url: str, **kwargs: Any) -> tuple[int, ...]:
    """The thresholds seen once ``run_poller`` says it polls; it is then stopped."""
    stop = threading.Event()
    lines: list[str] = []
    seen: list[tuple[int, ...]] = []

    def announce(line: str) -> None:
        lines.append(line)
        if "polling shards" in line:
            seen.append(gc.get_threshold())

    runner = threading.Thread(target=lambda: run_poller(
        lambda job: None, store=url, shards=[0, 1], metrics_address="off", install_signals=False,
        stop=stop, announce=announce, **kwargs))
    runner.start()
    try:
        wait_until(lambda: bool(seen) or not runner.is_alive(), 60, "the poller to start polling")
    finally:
        stop.set()
        runner.join()
    assert seen, lines
    return seen[0]


def test_run_poller_tunes_while_it_runs_and_restores_when_it_returns(pinned, tmp_path):
    assert _thresholds_while_running(_store(tmp_path))[:2] == POLLER_THRESHOLDS[:2]
    assert gc.get_threshold() == DEFAULTS


def test_run_poller_takes_the_settings_or_its_argument(pinned, tmp_path):
    url = _store(tmp_path)
    assert _thresholds_while_running(url, settings=Settings(gc_thresholds="keep")) == DEFAULTS
    assert _thresholds_while_running(url, settings=Settings(gc_thresholds="4000,20,20")) == (4000, 20, 20)
    assert _thresholds_while_running(url, settings=Settings(gc_thresholds="keep"),
                                     gc_thresholds=(3000, 10, 10)) == (3000, 10, 10)
    assert gc.get_threshold() == DEFAULTS


def test_a_bad_setting_is_refused_before_anything_starts(pinned, tmp_path):
    with pytest.raises(ConfigError, match="SCHEDULER_GC_THRESHOLDS"):
        run_poller(lambda job: None, store=_store(tmp_path), shards=[0], metrics_address="off",
                   install_signals=False, settings=Settings(gc_thresholds="off"))
    assert gc.get_threshold() == DEFAULTS


def test_settings_read_the_variable():
    assert Settings.from_env({}).gc_thresholds == "poller"
    assert Settings.from_env({"SCHEDULER_GC_THRESHOLDS": "keep"}).gc_thresholds == "keep"
