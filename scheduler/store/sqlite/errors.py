"""SQLite's errors as the store's: a schema missing or older than the code is
``SchemaError``; another process holding the file's lock past the busy timeout is
``StoreUnavailable`` (the store is there but cannot answer now, as a Cassandra that
times out cannot); anything else stays as it is. And the retention sweep, which must
never wait for another process's lock."""

from __future__ import annotations

import sqlite3

from ...errors import SchemaError, StoreUnavailable


def busy(exc: sqlite3.OperationalError) -> bool:
    """Another connection holds the lock (SQLITE_BUSY, extended codes included); not
    SQLITE_LOCKED ("database table is locked"), a conflict within this connection."""
    return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_BUSY


def store_error(url: str, exc: sqlite3.OperationalError) -> Exception:
    """The error to raise for ``exc`` met on the store at ``url``."""
    text = str(exc)
    if "no such table" in text or "no such column" in text or "has no column named" in text:
        return SchemaError(f"store {url} has no scheduler schema or an older one ({exc}); "
                           "run `scheduler schema apply`")
    if busy(exc):
        return StoreUnavailable(f"store {url} is busy: another process held its lock "
                                f"too long ({exc}); try again")
    return exc


def sweep_expired(db: sqlite3.Connection, statements: list[str], now_ms: int, busy_timeout_s: float) -> None:
    """Run the retention's deletes, skipped whole while another process holds the lock:
    the caller holds the store's lock, so a wait here would hold every caller behind it
    (the next sweep, a second later, deletes what this one did not)."""
    db.execute("PRAGMA busy_timeout = 0")
    try:
        for sql in statements:
            db.execute(sql, (now_ms,))
    except sqlite3.OperationalError:
        pass  # busy, or no schema yet, or older than v003 (v005): nothing (no replay) expires
    finally:
        db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
