"""The embedded store when another process holds the file's lock past the busy timeout:
the call fails as StoreUnavailable (what the API answers 503 to and the poller rides out),
not as sqlite3's own error, and writes nothing; reads and the retention sweep do not wait
behind the lock; the connection is usable again once the lock is released."""

import sqlite3
import time

import pytest

from scheduler.errors import StoreUnavailable
from scheduler.store import SchemaOptions
from scheduler.store.sqlite import store as sqlite_store
from scheduler.store.sqlite.errors import busy
from scheduler.store.sqlite.store import SqliteStore


@pytest.fixture
def locked(tmp_path, monkeypatch):
    """A store whose file another connection holds the write lock of, given the store's
    busy timeout: ``(store, other)``."""
    opened: list[tuple[SqliteStore, sqlite3.Connection]] = []

    def make(busy_timeout_s: float) -> tuple[SqliteStore, sqlite3.Connection]:
        monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_S", busy_timeout_s)
        store = SqliteStore(f"{tmp_path}/store.db")
        store.apply_schema(SchemaOptions(shard_count=4), 0)
        other = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        opened.append((store, other))
        return store, other

    yield make
    for store, other in opened:
        other.close()
        store.close()


def test_a_write_waiting_past_the_busy_timeout_is_store_unavailable_and_writes_nothing(locked):
    store, other = locked(0.2)
    with pytest.raises(StoreUnavailable, match="is busy: another process held its lock too long"):
        store.set_limits("k", 5.0, None, None, None, 1_000)
    other.execute("ROLLBACK")
    assert store.flow_limits() == []
    store.set_limits("k", 5.0, None, None, None, 1_000)  # no transaction was left open
    assert [lim.rate_per_s for lim in store.flow_limits()] == [5.0]


def test_reads_and_the_sweep_do_not_wait_for_the_lock(locked):
    store, _other = locked(20.0)
    store._next_sweep = 0.0  # the sweep is due: its deletes meet the lock
    started = time.monotonic()
    assert store.flow_limits() == []  # WAL: a read needs no lock; the sweep is skipped
    assert time.monotonic() - started < 10.0  # not the 20 s busy timeout
    assert store._db.execute("PRAGMA busy_timeout").fetchone()[0] == 20_000  # restored


def test_only_sqlite_busy_counts_as_another_process():
    err = sqlite3.OperationalError("database table is locked")
    err.sqlite_errorcode = sqlite3.SQLITE_LOCKED
    assert not busy(err)
    err = sqlite3.OperationalError("database is locked")
    err.sqlite_errorcode = sqlite3.SQLITE_BUSY
    assert busy(err)
    assert not busy(sqlite3.OperationalError("no code"))
