"""The coordinator URL, checked before anything connects. Pure, no I/O.

``local`` (or ``local:NAME``: pollers of one process), or
``zookeeper://HOST[:PORT][,HOST[:PORT]...]/ROOT``: hosts as kazoo reads them (a name,
an IPv4 address or a bracketed IPv6 one; port 2181 when none is given) and a root that
is a valid ZooKeeper path (no empty, ``.`` or ``..`` parts, no control characters).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import ConfigError, shown_url

FORMS = "use local or zookeeper://HOST:PORT[,HOST:PORT]/ROOT"
DEFAULT_ROOT = "/scheduler"


@dataclass(frozen=True)
class ZooKeeperUrl:
    hosts: str  # as kazoo takes them: "h1:2181,h2:2181"
    root: str


def _bad_char(c: str) -> bool:
    # The characters ZooKeeper refuses in a path (PathUtils.validatePath).
    n = ord(c)
    return n < 0x20 or 0x7F <= n <= 0x9F or 0xD800 <= n <= 0xF8FF or n >= 0xFFF0


def _check_root(url: str, path: str) -> str:
    root = path.rstrip("/") or DEFAULT_ROOT
    parts = root.split("/")[1:]
    if any(p in ("", ".", "..") for p in parts) or any(_bad_char(c) for c in root) or root == "/zookeeper":
        raise ConfigError(f"coordinator {shown_url(url)} has a bad root path {path!r}: give a ZooKeeper path "
                          "such as /scheduler")
    return root


def _check_host(url: str, item: str) -> None:
    try:
        parsed = urlsplit("zk://" + item)
        port = parsed.port  # ValueError for a port that is not a number in 0-65535
    except ValueError:
        parsed, port = None, None
    if (parsed is None or not parsed.hostname or parsed.path
            or port == 0 or any(_bad_char(c) or c.isspace() for c in item)):
        raise ConfigError(f"coordinator {shown_url(url)} has a bad host {item!r}: {FORMS}")


def check_coordinator_url(url: object) -> ZooKeeperUrl | None:
    """None for local coordination, the hosts and root of a ZooKeeper one; ``ConfigError``
    (one line) for anything else. Raises nothing else for any value."""
    if url is None or url == "" or url == "local":
        return None
    if not isinstance(url, str):
        raise ConfigError(f"coordinator must be text, got {type(url).__name__}: {FORMS}")
    if url.startswith("local:"):
        if any(_bad_char(c) for c in url):
            raise ConfigError(f"coordinator {shown_url(url)} holds a control character: {FORMS}")
        return None
    scheme, sep, rest = url.partition("://")
    if scheme.lower() != "zookeeper" or not sep:
        raise ConfigError(f"unknown coordinator {shown_url(url)}: {FORMS}")
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        # Never echo it: the part before @ may be a password.
        raise ConfigError("the coordinator URL holds credentials: remove them and put user:password "
                          "in the file named by SCHEDULER_ZK_AUTH_FILE")
    if "?" in rest or "#" in rest or not netloc:
        raise ConfigError(f"coordinator {shown_url(url)} is malformed: {FORMS}")
    for item in netloc.split(","):
        _check_host(url, item)
    return ZooKeeperUrl(netloc, _check_root(url, slash + path))
