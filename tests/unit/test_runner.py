"""``run_poller`` on the embedded store: its exit codes."""

from __future__ import annotations

import threading
from typing import Any

from scheduler import Client, Job, run_poller
from scheduler.clock import SystemClock
from scheduler.keys import from_ms
from scheduler.poller import PollerConfig
from scheduler.runner import EXIT_FAILED, EXIT_OK
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
