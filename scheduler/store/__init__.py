"""Store selection by URL: ``cassandra://...`` or ``sqlite:///path``."""

from __future__ import annotations

from ..errors import ConfigError, shown_url
from .base import SchemaOptions, SchemaResult, Store, StoreMeta

__all__ = ["SchemaOptions", "SchemaResult", "Store", "StoreMeta", "check_store_url", "open_store",
           "sqlite_path"]

_SQLITE_FORMS = "use sqlite:///absolute/path.db or sqlite://relative/path.db"
_FORMS = "use cassandra://HOST[,HOST][:PORT]/KEYSPACE or sqlite:///PATH"


def _scheme(url: str) -> str:
    return url.split(":", 1)[0].lower() if ":" in url else ""


def sqlite_path(url: str) -> str:
    """``sqlite:///abs/path`` -> ``/abs/path``; ``sqlite://rel/path`` -> ``rel/path``.
    ``ConfigError`` for anything else (``sqlite:/x.db`` with one slash, no path, a NUL)."""
    scheme, sep, path = url.partition("://")
    if scheme.lower() != "sqlite" or not sep:
        raise ConfigError(f"store URL {shown_url(url)} is malformed: {_SQLITE_FORMS}")
    if not path or path == "/":
        raise ConfigError(f"store URL {shown_url(url)} has no path: {_SQLITE_FORMS}")
    if "\x00" in path:
        raise ConfigError(f"store URL {shown_url(url)} holds a NUL character: {_SQLITE_FORMS}")
    return path


def _has_control(text: str) -> bool:
    """Whether ``text`` holds a C0 control, DEL or a C1 control character."""
    return any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in text)


def check_store_url(url: object) -> str:
    """``url`` if it is a well-formed store URL, else ``ConfigError``; connects to
    nothing, and raises nothing else for any value. A control character (C0, DEL, C1)
    is refused in every URL: it would end up in a file name or a host name, and an
    escape sequence in either misleads whoever reads it later."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"no store URL given: {_FORMS}")
    scheme = _scheme(url)
    if _has_control(url):
        # Shown escaped, and only for a scheme we know: another may be a mistyped secret.
        shown = f"store URL {shown_url(url)}" if scheme in ("sqlite", "cassandra") else "the store URL"
        raise ConfigError(f"{shown} holds a control character (C0, DEL or C1): remove it; {_FORMS}")
    if scheme == "sqlite":
        sqlite_path(url)
    elif scheme == "cassandra":
        from .cassandra.conf import CassandraUrl

        try:
            cfg = CassandraUrl(url)
        except ValueError:  # urlparse's own (an unclosed [IPv6] host, a bad port)
            raise ConfigError(f"store URL {shown_url(url)} is malformed: {_FORMS}") from None
        if not 0 < cfg.port < 65536 or not all(h.isprintable() and " " not in h for h in cfg.hosts):
            raise ConfigError(f"store URL {shown_url(url)} has a bad host or port: {_FORMS}")
        if cfg.protocol_version < 3:
            raise ConfigError(f"store URL {shown_url(url)}: protocol_version must be 3 or more")
    else:
        # Never echo the URL here: an unknown scheme may be a mistyped URL holding a secret.
        raise ConfigError(f"unknown store URL scheme {scheme!r}: {_FORMS}" if scheme
                          else f"the store URL has no scheme: {_FORMS}")
    return url


def open_store(url: str, *, create: bool = True, **options: object) -> Store:
    """Connect to the store named by ``url``.

    ``create=False`` (every command but ``schema apply``): an embedded store whose file
    does not exist is refused (``StoreUnavailable``) instead of created empty.

    Raises ``ConfigError`` for an unknown or malformed URL and ``StoreUnavailable`` when
    the store cannot be reached; nothing is written either way.
    """
    check_store_url(url)
    if _scheme(url) == "sqlite":
        from .sqlite.store import SqliteStore

        return SqliteStore(sqlite_path(url), url=url, create=create)
    from .cassandra.store import CassandraStore

    return CassandraStore(url, **options)  # type: ignore[arg-type]
