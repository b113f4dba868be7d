"""The embedded store when another process holds the file's lock past the busy timeout:
the call fails as StoreUnavailable (what the API answers 503 to and the poller rides out),
not as sqlite3's own error, and writes nothing."""

import sqlite3

import pytest

from scheduler.errors import StoreUnavailable
from scheduler.store import SchemaOptions, open_store
from scheduler.store.sqlite import store as sqlite_store


def test_a_write_waiting_past_the_busy_timeout_is_store_unavailable(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_S", 0.1)
    url = f"sqlite:///{tmp_path}/store.db"
    store = open_store(url)
    store.apply_schema(SchemaOptions(shard_count=4), 0)
    other = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailable, match="is busy: another process held its lock too long"):
            store.set_limits("k", 5.0, None, None, None, 1_000)
        other.execute("ROLLBACK")
        assert store.flow_limits() == []
        store.set_limits("k", 5.0, None, None, None, 1_000)
        assert [lim.rate_per_s for lim in store.flow_limits()] == [5.0]
    finally:
        other.close()
        store.close()
