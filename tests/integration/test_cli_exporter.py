"""``scheduler exporter`` closes what it opened when its start-up fails: the store, the
exporter's threads and the metrics server, whichever step fails (the metrics address
already bound, or the signal handlers refused off the main thread after it bound). The
fleet is read from the ZooKeeper that is running for the tests (so not a unit test: in
``ops/test`` the unit tests run while the servers start)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

import scheduler.cli.main  # noqa: F401  (registers every command)
from scheduler.cli import ops
from scheduler.cli.common import EXIT_ERROR, app, store_for
from tests.conftest import ZOOKEEPER_HOSTS
from tests.procs import wait_until

COORDINATOR = f"zookeeper://{ZOOKEEPER_HOSTS.split(',')[0]}/scheduler-test-exporter"


def cli(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def opened(tmp_path: Path, monkeypatch: Any, zookeeper_available: None) -> tuple[str, list[Any], list[Any]]:
    """A store URL, and the stores the command opens and closes (recorded)."""
    url = f"sqlite:///{tmp_path}/s.db"
    assert cli("schema", "apply", "--store", url).exit_code == 0
    stores: list[Any] = []
    closed: list[Any] = []

    def recorded(store: str | None, **kwargs: Any) -> Any:
        st = store_for(store, **kwargs)
        close = st.close

        def recorded_close() -> None:
            closed.append(st)
            close()

        st.close = recorded_close
        stores.append(st)
        return st

    monkeypatch.setattr(ops, "store_for", recorded)
    return url, stores, closed


def threads_left(before: set[threading.Thread]) -> list[str]:
    return [t.name for t in threading.enumerate() if t not in before and t.is_alive()]


def test_a_taken_metrics_address_exits_1_and_leaves_nothing_open(opened: Any) -> None:
    url, stores, closed = opened
    before = set(threading.enumerate())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = cli("exporter", "--store", url, "--coordinator", COORDINATOR,
                  "--address", f"127.0.0.1:{port}")
    assert res.exit_code == EXIT_ERROR, res.output
    assert res.output.startswith("error: cannot serve metrics on 127.0.0.1:") and res.output.count("\n") == 1
    assert len(stores) == 1 and closed == stores
    # The fleet's ZooKeeper client (kazoo's connection thread) and the exporter's.
    wait_until(lambda: not threads_left(before), 30, "the command's threads to end")


def test_a_failure_after_binding_closes_the_server_the_exporter_and_the_store(opened: Any) -> None:
    url, stores, closed = opened
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    before = set(threading.enumerate())
    results: list[Result] = []
    # Off the main thread, installing the signal handlers raises ValueError: after the
    # metrics server bound its port.
    runner = threading.Thread(target=lambda: results.append(cli(
        "exporter", "--store", url, "--coordinator", COORDINATOR, "--address", f"127.0.0.1:{port}")))
    before.add(runner)
    runner.start()
    runner.join()
    assert results[0].exit_code == EXIT_ERROR and "ValueError: signal only works in main thread" \
        in results[0].output, results[0].output
    assert len(stores) == 1 and closed == stores
    with socket.socket() as again:  # the server closed its socket: the port binds at once
        again.bind(("127.0.0.1", port))
    wait_until(lambda: not threads_left(before), 30, "the command's threads to end")
