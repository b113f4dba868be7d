"""``run_poller`` on the embedded store: its exit codes."""

from __future__ import annotations

import threading
from typing import Any

from scheduler import Client, Job, run_poller
from scheduler.domain.clock import SystemClock
from scheduler.domain.keys import from_ms
from scheduler.poller import Poller, PollerConfig
from scheduler.runtime import runner as runner_module
from scheduler.runtime.runner import EXIT_FAILED, EXIT_OK, with_settings
from scheduler.settings import Settings
from scheduler.store import SchemaOptions, open_store
from tests.procs import wait_until


class Boom(BaseException):
    pass


def boom(job: Job) -> None:
    raise Boom("a bug escaping every except Exception")


def _store(tmp_path: Any) -> str:
    url = f"sqlite:///{tmp_path}/s.db"
    st = open_store(url)
    st.apply_schema(SchemaOptions(shard_count=2), SystemClock().now_ms())
    st.close()
    return url


def test_a_crashed_thread_exits_4(tmp_path):
    url = _store(tmp_path)
    with Client(url) as client:
        client.schedule("j", from_ms(SystemClock().now_ms()), "k")  # placed at now + 3 s
    code = run_poller(boom, store=url, shards=range(2), metrics_address="off", install_signals=False,
                      config=PollerConfig(shutdown_timeout_s=1))
    assert code == EXIT_FAILED


def _run_until_polling(**kwargs: Any) -> tuple[int, list[str]]:
    """``run_poller(**kwargs)`` in a thread, stopped once it says it polls (not after a
    fixed delay); its exit code and the lines it announced."""
    stop = threading.Event()
    lines: list[str] = []
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(run_poller(
        lambda job: None, metrics_address="off", install_signals=False, stop=stop,
        announce=lines.append, **kwargs)))
    runner.start()
    try:
        wait_until(lambda: any("polling shards" in line for line in lines) or not runner.is_alive(),
                   60, "the poller to start polling")
    finally:
        stop.set()
        runner.join()
    assert codes, "run_poller raised"
    return codes[0], lines


def test_stop_exits_0(tmp_path):
    code, lines = _run_until_polling(store=_store(tmp_path), shards=[0, 1])
    assert code == EXIT_OK and "polling shards 0-1 of" in lines[0]


def test_the_poller_writes_occurrences_with_the_runners_settings(tmp_path, monkeypatch):
    """The producer settings a config leaves unset come from ``run_poller``'s Settings
    (SCHEDULER_LAYOUT_CACHE_TTL_S, SCHEDULER_NUDGE); those it sets are kept."""
    made: list[Poller] = []

    class Recorded(Poller):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(runner_module, "Poller", Recorded)
    settings = Settings(layout_cache_ttl_s=2, nudge=False)
    url = _store(tmp_path)
    code, _ = _run_until_polling(store=url, shards=[0, 1], settings=settings)
    assert code == EXIT_OK
    producer = made[-1].occurrences.producer
    assert (producer.layout_cache_ttl_s, producer.nudger) == (2, None)
    code, _ = _run_until_polling(store=url, shards=[0, 1], settings=settings,
                                 config=PollerConfig(layout_cache_ttl_s=1.5, nudge=True))
    assert code == EXIT_OK
    producer = made[-1].occurrences.producer
    assert producer.layout_cache_ttl_s == 1.5 and producer.nudger is not None
    assert with_settings(PollerConfig(), Settings()).nudge is True


def test_fixed_shards_that_do_not_exist_are_refused(tmp_path):
    import pytest

    from scheduler.errors import InvalidInput

    url = _store(tmp_path)  # 2 shards
    with pytest.raises(InvalidInput, match="shards 2-4,9 do not exist"):
        run_poller(lambda job: None, store=url, shards=[0, 2, 3, 4, 9], metrics_address="off",
                   install_signals=False)


def test_app_handler_refuses_retry_settings_it_would_ignore_or_misread():
    import pytest

    from scheduler import App
    from scheduler.errors import InvalidInput

    app = App()
    for bad in ({"max_attempts": 0}, {"max_attempts": -1}, {"max_attempts": True}, {"max_attempts": 2.5},
                {"backoff_base_s": 0}, {"backoff_cap_s": float("nan")}, {"backoff_base_s": float("inf")}):
        with pytest.raises(InvalidInput) as err:
            app.handler("k", **bad)
        assert isinstance(err.value, ValueError)
    with pytest.raises(InvalidInput, match="not a short identifier"):
        app.handler("no spaces allowed")
    app.handler("k", max_attempts=1)(lambda job: None)
    assert app.routes["k"].policy.max_attempts == 1  # one attempt, no retry: not the default 5
