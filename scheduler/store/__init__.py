"""Store selection by URL: ``cassandra://...`` or ``sqlite:///path``."""

from __future__ import annotations

from urllib.parse import urlparse

from ..errors import ConfigError
from .base import SchemaOptions, SchemaResult, Store, StoreMeta

__all__ = ["SchemaOptions", "SchemaResult", "Store", "StoreMeta", "open_store", "sqlite_path"]


def sqlite_path(url: str) -> str:
    """``sqlite:///abs/path`` -> ``/abs/path``; ``sqlite://rel/path`` -> ``rel/path``."""
    parsed = urlparse(url)
    path = parsed.netloc + parsed.path
    if not path:
        raise ConfigError(f"store URL {url!r} has no path; use sqlite:///path/to/file.db")
    return path


def open_store(url: str, **options: object) -> Store:
    """Connect to the store named by ``url``.

    Raises ``ConfigError`` for an unknown or malformed URL and ``StoreUnavailable`` when
    the store cannot be reached; nothing is written either way.
    """
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "sqlite":
        from .sqlite import SqliteStore

        return SqliteStore(sqlite_path(url), url=url)
    if scheme == "cassandra":
        from .cassandra import CassandraStore

        return CassandraStore(url, **options)  # type: ignore[arg-type]
    raise ConfigError(
        f"unknown store URL {url!r}: use cassandra://HOST[,HOST][:PORT]/KEYSPACE or sqlite:///PATH"
    )
