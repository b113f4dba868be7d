"""``run_poller`` closes what it opened on every way out, a start-up that fails half-way
included: the store it opened, the coordinator it opened, the metrics server (its port
free again), the poller's threads and event loop, and the signal handlers it installed.
The embedded store and the in-process coordinator: no servers."""

from __future__ import annotations

import signal
import socket
from typing import Any

import pytest

from scheduler.domain.clock import SystemClock
from scheduler.errors import ConfigError, OwnershipLost, SchedulerError, SchemaError
from scheduler.fleet.coord import LocalCoordinator
from scheduler.poller import Poller
from scheduler.runtime import runner
from scheduler.runtime.runner import EXIT_OK, run_poller
from scheduler.store import SchemaOptions, open_store


class Spied(LocalCoordinator):
    """A coordinator that notes its stop; ``fail_start`` makes its start fail as an
    unreachable ZooKeeper does."""

    def __init__(self, root: str, fail_start: bool = False) -> None:
        super().__init__(root)
        self.fail_start = fail_start
        self.stops = 0

    def start(self, member_id: str) -> None:
        if self.fail_start:
            raise SchedulerError("ZooKeeper unreachable at zk:2181 (test)")
        super().start(member_id)

    def stop(self) -> None:
        self.stops += 1
        super().stop()


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> dict[str, Any]:
    """What ``run_poller`` opens, noted: ``stores`` (each with the number of its
    closes), ``coordinators``."""
    seen: dict[str, Any] = {"stores": [], "coordinators": []}
    real_open = open_store

    def open_store_spied(url: str, **kw: Any) -> Any:
        st = real_open(url, **kw)
        entry: dict[str, Any] = {"store": st, "closes": 0}
        real_close = st.close

        def close() -> None:
            entry["closes"] += 1
            real_close()
        st.close = close  # type: ignore[method-assign]
        seen["stores"].append(entry)
        return st

    def open_coordinator_spied(url: str, **kw: Any) -> Spied:
        coord = Spied(f"{tmp_path}-{len(seen['coordinators'])}")
        seen["coordinators"].append(coord)
        return coord

    monkeypatch.setattr(runner, "open_store", open_store_spied)
    monkeypatch.setattr(runner, "open_coordinator", open_coordinator_spied)
    return seen


def _store(tmp_path: Any, schema: bool = True) -> str:
    url = f"sqlite:///{tmp_path}/s.db"
    st = open_store(url, create=True)
    if schema:
        st.apply_schema(SchemaOptions(shard_count=2), SystemClock().now_ms())
    st.close()
    return url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bindable(port: int) -> bool:
    """True when a listening socket can take ``port`` (nothing listens on it)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        s.listen()
        return True


def _handlers() -> tuple[Any, Any]:
    return signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)


def test_a_taken_metrics_port_closes_the_store_and_the_coordinator_opened_before(tmp_path, opened):
    url = _store(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match="cannot serve metrics"):
            run_poller(lambda job: None, store=url, coordinator="local",
                       metrics_address=f"127.0.0.1:{port}", install_signals=False)
    assert [s["closes"] for s in opened["stores"]] == [1]
    assert [c.stops for c in opened["coordinators"]] == [1]


def test_no_schema_after_the_metrics_server_started_frees_its_port_and_closes_the_rest(tmp_path, opened):
    url = _store(tmp_path, schema=False)
    port = _free_port()
    before = _handlers()
    with pytest.raises(SchemaError, match="no scheduler schema"):
        run_poller(lambda job: None, store=url, coordinator="local", metrics_address=f"127.0.0.1:{port}")
    assert _bindable(port), "the metrics server still listens"
    assert [s["closes"] for s in opened["stores"]] == [1]
    assert [c.stops for c in opened["coordinators"]] == [1]
    assert _handlers() == before


def test_a_coordinator_that_cannot_connect_leaves_nothing_open(tmp_path, opened):
    url = _store(tmp_path)
    port = _free_port()
    coord = Spied(str(tmp_path), fail_start=True)
    before = _handlers()
    with pytest.raises(SchedulerError, match="ZooKeeper unreachable"):
        run_poller(lambda job: None, store=url, coordinator=coord, metrics_address=f"127.0.0.1:{port}")
    assert _bindable(port), "the metrics server still listens"
    assert [s["closes"] for s in opened["stores"]] == [1]
    assert coord.stops == 1  # as on a planned stop: the fleet's stop stops it once
    assert _handlers() == before


def test_a_claim_refused_half_way_stops_the_poller_and_hands_back_the_shard_it_took(
        tmp_path, opened, monkeypatch):
    url = _store(tmp_path)
    port = _free_port()
    made: list[Any] = []

    class Refusing(Poller):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            made.append(self)
            real_claim = self.store.claim_shard

            def claim_shard(shard: int, *a: Any) -> Any:
                if shard == 1:
                    raise OwnershipLost("shard 1 is held by another poller (test)")
                return real_claim(shard, *a)
            self.store.claim_shard = claim_shard  # type: ignore[method-assign, assignment]

    async def handler(job: Any) -> None:  # coroutines: the poller owns an event loop
        pass

    monkeypatch.setattr(runner, "Poller", Refusing)
    with pytest.raises(OwnershipLost):
        run_poller(handler, store=url, shards=[0, 1], metrics_address=f"127.0.0.1:{port}",
                   install_signals=False)
    [poller] = made
    assert poller.core.stopped.is_set(), "the poller was not stopped"
    assert poller.workers.loop.is_closed(), "the poller's event loop was left open"
    assert _bindable(port)
    assert [s["closes"] for s in opened["stores"]] == [1]
    st = open_store(url)
    try:
        owners = {c.shard: c.owner for c in st.checkpoints()}
    finally:
        st.close()
    assert not owners.get(0), "shard 0, claimed before the refusal, is still held"


def test_a_planned_stop_closes_everything_and_restores_the_signal_handlers(tmp_path, opened):
    import threading

    url = _store(tmp_path)
    port = _free_port()
    stop = threading.Event()
    before = _handlers()
    lines: list[str] = []

    def announce(line: str) -> None:
        lines.append(line)
        assert _handlers() != before  # ours while it runs
        stop.set()

    code = run_poller(lambda job: None, store=url, coordinator="local", stop=stop,
                      metrics_address=f"127.0.0.1:{port}", announce=announce)
    assert code == EXIT_OK and any("joined the fleet" in line for line in lines)
    assert _bindable(port)
    assert [s["closes"] for s in opened["stores"]] == [1]
    assert [c.stops for c in opened["coordinators"]] == [1]
    assert _handlers() == before
