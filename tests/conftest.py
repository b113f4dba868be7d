"""Fixtures for real servers.

A server that cannot be reached skips the test locally and fails it when CI=true
(dramatiq's pattern): CI must never go green by skipping everything.

Environment: CASSANDRA_HOSTS (default 127.0.0.1), CASSANDRA_PORT (9042),
ZOOKEEPER_HOSTS (127.0.0.1:2181).
"""

from __future__ import annotations

import gc
import os
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from scheduler.domain.clock import SystemClock
from scheduler.domain.keys import bucket_of_ms
from scheduler.domain.model import Job
from scheduler.store import SchemaOptions, Store, open_store

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(autouse=True)
def _gc_defaults() -> None:
    """Every test starts with CPython's collector thresholds: importing ``bench`` sets a
    poller's for the whole process (as ``python -m bench...`` needs), and a test must not
    depend on which modules were collected."""
    gc.set_threshold(700, 10, 10)


# Property-based tests of the parsers that meet outside input (hypothesis). The default
# profile is bounded so the whole suite stays within CI's time, and derandomized so a run
# of main is repeatable (a new finding comes from `ops/test --fuzz`, not as a flake of an
# unrelated change); `ops/test --fuzz` selects the long, random one (SCHEDULER_FUZZ=1).
# No example database: a run depends on nothing a previous run left behind.
settings.register_profile("bounded", max_examples=150, deadline=None, database=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("fuzz", max_examples=5_000, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("fuzz" if os.environ.get("SCHEDULER_FUZZ") else "bounded")
CASSANDRA_HOSTS = os.environ.get("CASSANDRA_HOSTS", "127.0.0.1")
CASSANDRA_PORT = int(os.environ.get("CASSANDRA_PORT", "9042"))
ZOOKEEPER_HOSTS = os.environ.get("ZOOKEEPER_HOSTS", "127.0.0.1:2181")


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def require_server(name: str, host: str, port: int, start_hint: str) -> None:
    if _reachable(host, port):
        return
    msg = f"{name} is not reachable at {host}:{port}; start it with {start_hint}"
    if CI:
        pytest.fail(msg + " (CI=true: a missing server fails the run)")
    pytest.skip(msg)


def require_tool(name: str, package: str = "prometheus") -> str:
    """Path of a tool from a Debian package that ops/setup installs; a missing one fails
    the run in CI and skips the test elsewhere."""
    import shutil

    path = shutil.which(name)
    if path:
        return path
    msg = f"{name} is not installed; run ops/setup (it installs Debian's {package} package)"
    if CI:
        pytest.fail(msg + " (CI=true: a missing tool fails the run)")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def promtool() -> str:
    return require_tool("promtool")


@pytest.fixture(scope="session")
def prometheus() -> str:
    return require_tool("prometheus")


@pytest.fixture(scope="session")
def cassandra_available() -> None:
    require_server("Cassandra", CASSANDRA_HOSTS.split(",")[0], CASSANDRA_PORT, "ops/cassandra start")


@pytest.fixture(scope="session")
def zookeeper_available() -> None:
    host, _, port = ZOOKEEPER_HOSTS.split(",")[0].partition(":")
    require_server("ZooKeeper", host, int(port or 2181), "ops/zookeeper start")


def cassandra_url(keyspace: str) -> str:
    return f"cassandra://{CASSANDRA_HOSTS}:{CASSANDRA_PORT}/{keyspace}"


@pytest.fixture
def cassandra_keyspace(cassandra_available: None) -> Iterator[str]:
    """A fresh keyspace name for this test, dropped afterwards."""
    name = "t_" + uuid.uuid4().hex[:12]
    yield name
    from scheduler.store.cassandra.store import CassandraStore

    admin = CassandraStore(cassandra_url(name))
    try:
        admin.session.execute(f"DROP KEYSPACE IF EXISTS {name}")
    finally:
        admin.close()


def make_store(kind: str, request: Any, tmp_path: Any, options: SchemaOptions | None = None,
               now_ms: int | None = None) -> Store:
    """A store of ``kind`` with a fresh schema."""
    if kind == "sqlite":
        store = open_store(f"sqlite:///{tmp_path}/store.db")
    elif kind == "secure":
        # Created (and its schema applied) by admin; the test runs as the app role.
        from tests.secure import create_keyspace, open_as

        name = request.getfixturevalue("secure_keyspace")
        create_keyspace(name, options or SchemaOptions(),
                        SystemClock().now_ms() if now_ms is None else now_ms)
        return open_as("app", name)
    else:
        keyspace = request.getfixturevalue("cassandra_keyspace")
        store = open_store(cassandra_url(keyspace))
    store.apply_schema(options or SchemaOptions(),
                       SystemClock().now_ms() if now_ms is None else now_ms)
    return store


def drop_table(store: Store, table: str) -> None:
    """Drop one table of a store, as if the schema version that created it had not been
    applied. (Code of schema v007 or later cannot write jobs to a store older than v007,
    so "a store before vN" for N < 7 is a current store without vN's table.)"""
    if hasattr(store, "session"):
        store.session.execute(f"DROP TABLE {store.keyspace}.{table}")  # type: ignore[attr-defined]
    else:
        with store._tx() as db:  # type: ignore[attr-defined]
            db.execute(f"DROP TABLE {table}")


def reapply_version(store: Store, version: int) -> None:
    """Run one schema version's statements again (every one is CREATE ... IF NOT EXISTS):
    what `schema apply` did for a store that had not had that version."""
    from scheduler.store import queries

    cassandra = hasattr(store, "session")
    [text] = [t for v, _, t in queries.versions("versions" if cassandra else "sqlite") if v == version]
    for stmt in queries.statements(text):
        if cassandra:
            store.session.execute(stmt.replace("{keyspace}", store.keyspace))  # type: ignore[attr-defined]
        else:
            with store._tx() as db:  # type: ignore[attr-defined]
                db.execute(stmt)


def bucket_job(job_id: str, fire_ms: int, kind: str = "k", shard: int = 0, data: bytes = b"{}") -> Job:
    """A pending job due at ``fire_ms`` in its 60 s bucket, for tests that write rows
    straight into a store."""
    return Job(job_id=job_id, kind=kind, data=data, data_json=True, due_ms=fire_ms,
               fire_ms=fire_ms, bucket=bucket_of_ms(fire_ms, 60), shard=shard)


def sqlite_dump(url: str) -> list[str]:
    """Every row of the embedded store at ``url`` as SQL text: equal dumps, nothing written."""
    import sqlite3

    db = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        return list(db.iterdump())
    finally:
        db.close()


@pytest.fixture(params=["sqlite", "cassandra"])
def store_kind(request: Any) -> str:
    return str(request.param)


@pytest.fixture
def store(store_kind: str, request: Any, tmp_path: Any) -> Iterator[Store]:
    """The contract fixture: the same test runs on the embedded store and on Cassandra."""
    st = make_store(store_kind, request, tmp_path)
    yield st
    st.close()


@pytest.fixture(scope="session")
def secure_stack() -> None:
    """The secured stack of ops/secure-stack (ops/test starts it)."""
    require_server("The secured Cassandra", "127.0.0.1", 9142, "ops/secure-stack start")
    require_server("The TLS ZooKeeper", "127.0.0.1", 2281, "ops/secure-stack start")


@pytest.fixture
def secure_keyspace(secure_stack: None) -> Iterator[str]:
    """A fresh keyspace name on the secured stack, dropped afterwards."""
    from tests.secure import secure_keyspace as make

    yield from make()


@pytest.fixture
def zk_root(zookeeper_available: None) -> Iterator[str]:
    """A fresh ZooKeeper root path for this test, deleted afterwards."""
    from kazoo.client import KazooClient

    root = f"/test-{uuid.uuid4().hex[:12]}"
    yield root
    zk = KazooClient(hosts=ZOOKEEPER_HOSTS)
    zk.start(timeout=10)
    try:
        zk.delete(root, recursive=True)
    except Exception:
        pass
    finally:
        zk.stop()
        zk.close()


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Fault tests stop or cut off the servers the other tests share: run them last.
    Tests of the 3-node cluster run only when asked for (``-m cluster3``), because that
    cluster cannot run beside the single node (both listen on 127.0.0.1:9042)."""
    markexpr = config.getoption("-m") or ""
    if "cluster3" not in markexpr:
        skip = pytest.mark.skip(reason="needs the 3-node cluster: ops/test runs it with -m cluster3")
        for item in items:
            if "cluster3" in item.keywords:
                item.add_marker(skip)
    items.sort(key=lambda item: "fault" in item.keywords)


class Blocking:
    """An ``AsyncClient`` behind blocking calls, so the one contract suite drives both
    clients: each coroutine method runs to completion on a private event loop (so the
    Cassandra store's futures resolve through a real loop)."""

    def __init__(self, target: Any, loop: Any) -> None:
        self._target, self._loop = target, loop

    def __getattr__(self, name: str) -> Any:
        import inspect

        attr = getattr(self._target, name)
        if name == "recurring":
            return Blocking(attr, self._loop)
        if inspect.iscoroutinefunction(attr):
            return lambda *a, **k: self._loop.run_until_complete(attr(*a, **k))
        return attr

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._target, name, value)


@pytest.fixture(params=["sync", "async"])
def make_client(request: Any) -> Iterator[Any]:
    """``make_client(store, **options)``: a ``Client``, or an ``AsyncClient`` seen through
    ``Blocking``; closed at the end of the test."""
    import asyncio

    from scheduler import AsyncClient, Client

    loop = asyncio.new_event_loop() if request.param == "async" else None
    made: list[Any] = []

    def make(store: Store, **options: Any) -> Any:
        c = Client(store, **options) if loop is None else Blocking(AsyncClient(store, **options), loop)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
    if loop is not None:
        loop.close()
