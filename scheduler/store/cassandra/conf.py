"""The Cassandra store's URL, replication settings and error mapping: no driver
connection here (the driver's exception types are imported only to map them)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlparse

from ...diagnose import explain_unauthorized
from ...domain.keys import to_ms
from ...errors import ConfigError, PermissionDenied, SchedulerError, StoreUnavailable, WriteTimeout

# Multi-partition IN reads go out in groups of this many keys: one request per group
# instead of one per key (the client's CPU per request, not the server, is the limit).
READ_GROUP = 64

KEYSPACE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,47}$")
DEFAULT_PORT = 9042


def dt_ms(value: datetime | int) -> int:
    """Epoch ms of a driver timestamp (a naive UTC datetime)."""
    if isinstance(value, int):
        return value
    return to_ms(value.replace(tzinfo=UTC))


def replication_map(spec: str) -> str:
    """CQL replication map for ``simple:RF`` or ``nts:dc1=RF,dc2=RF``."""
    kind, _, rest = spec.partition(":")
    try:
        if kind == "simple":
            rf = int(rest or "1")
            if rf < 1:
                raise ValueError
            return f"{{'class': 'SimpleStrategy', 'replication_factor': {rf}}}"
        if kind == "nts":
            parts = []
            for item in rest.split(","):
                dc, _, rf_text = item.partition("=")
                if not re.match(r"^[\w.-]+$", dc) or int(rf_text) < 1:
                    raise ValueError
                parts.append(f"'{dc}': {int(rf_text)}")
            if parts:
                return "{'class': 'NetworkTopologyStrategy', " + ", ".join(parts) + "}"
    except ValueError:
        pass
    raise ConfigError(
        f"replication {spec!r} is not valid: use simple:RF (development) or "
        "nts:DC=RF[,DC=RF...] (production)"
    )


class CassandraUrl:
    """``cassandra://host[,host2][:port]/keyspace[?local_dc=DC&consistency=LOCAL_QUORUM]``"""

    def __init__(self, url: str) -> None:
        parsed = urlparse(url)
        userinfo, _, netloc = parsed.netloc.rpartition("@")
        if ":" in userinfo:
            # Never echo the URL: it holds a secret.
            raise ConfigError("the store URL holds a password: remove it (cassandra://USER@HOST/KEYSPACE) "
                              "and put the password in the file named by SCHEDULER_CASSANDRA_PASSWORD_FILE")
        hosts, port = [], DEFAULT_PORT
        for item in netloc.split(","):
            host, _, port_text = item.partition(":")
            if not host:
                raise ConfigError(f"store URL {url!r} has an empty host; use cassandra://HOST/KEYSPACE")
            hosts.append(host)
            if port_text:
                if not port_text.isdigit():
                    raise ConfigError(f"store URL {url!r} has a bad port {port_text!r}")
                port = int(port_text)
        keyspace = parsed.path.strip("/")
        if not KEYSPACE_RE.match(keyspace):
            raise ConfigError(
                f"store URL {url!r} needs a keyspace name of letters, digits and '_' "
                "(e.g. cassandra://127.0.0.1/scheduler)"
            )
        q = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        unknown = set(q) - {"local_dc", "consistency", "protocol_version"}
        if unknown:
            raise ConfigError(f"store URL {url!r} has unknown option(s): {', '.join(sorted(unknown))}")
        self.url, self.hosts, self.port, self.keyspace = url, hosts, port, keyspace
        self.user = userinfo or None
        self.local_dc = q.get("local_dc")
        self.consistency = q.get("consistency", "LOCAL_QUORUM").upper()
        self.protocol_version = int(q.get("protocol_version", "5"))


def translate(exc: BaseException, what: str) -> SchedulerError:
    """Map a driver exception to the library's typed errors."""
    from cassandra import OperationTimedOut, Unavailable
    from cassandra import WriteTimeout as DriverWriteTimeout
    from cassandra.cluster import NoHostAvailable

    if isinstance(exc, SchedulerError):
        return exc
    if isinstance(exc, DriverWriteTimeout | OperationTimedOut):
        return WriteTimeout(
            f"{what} timed out and may have been applied ({type(exc).__name__}); "
            "retrying the same call is safe", maybe_applied=True)
    if isinstance(exc, Unavailable):
        return WriteTimeout(
            f"{what} was not applied: not enough replicas alive ({exc}); retry later",
            maybe_applied=False)
    if type(exc).__name__ == "Unauthorized":
        return explain_unauthorized(str(getattr(exc, "summary", "") or exc))
    if isinstance(exc, NoHostAvailable):
        for cause in getattr(exc, "errors", {}).values():
            if type(cause).__name__ == "Unauthorized":
                return explain_unauthorized(str(cause))
        return StoreUnavailable(f"{what} failed: no Cassandra host answered; check the cluster")
    return StoreUnavailable(f"{what} failed: {type(exc).__name__}: {exc}")


def prepare_failed(exc: BaseException, name: str) -> SchedulerError:
    """The error for a statement that could not be prepared: a missing permission as
    such, anything else as ``StoreUnavailable`` (nothing was sent; retrying is safe)."""
    err = translate(exc, f"preparing {name}")
    if isinstance(err, PermissionDenied):
        return err
    return StoreUnavailable(f"preparing {name} failed ({type(exc).__name__}); nothing was sent, "
                            "retrying is safe once Cassandra answers")
