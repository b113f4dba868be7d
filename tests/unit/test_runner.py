"""``run_poller`` on the embedded store: its exit codes."""

from __future__ import annotations

import threading
from typing import Any

from scheduler import Client, Job, run_poller
from scheduler.domain.clock import SystemClock
from scheduler.domain.keys import from_ms
from scheduler.poller import PollerConfig
from scheduler.runtime.runner import EXIT_FAILED, EXIT_OK
from scheduler.store import SchemaOptions, open_store


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


def test_stop_exits_0(tmp_path):
    url = _store(tmp_path)
    stop = threading.Event()
    lines: list[str] = []
    threading.Timer(1.0, stop.set).start()
    code = run_poller(lambda job: None, store=url, shards=[0, 1], metrics_address="off",
                      install_signals=False, stop=stop, announce=lines.append)
    assert code == EXIT_OK and "polling shards 0-1 of" in lines[0]


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
