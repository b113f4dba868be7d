"""The Cassandra store's URL, replication settings and error mapping: no driver
connection here (the driver's exception types are imported only to map them)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlparse

from ...diagnose import explain_unauthorized
from ...domain.keys import to_ms
from ...domain.topology import check_dc, parse_write_consistency, replication_cql
from ...errors import ConfigError, PermissionDenied, SchedulerError, StoreUnavailable, WriteTimeout

# Multi-partition IN reads go out in groups of this many keys: one request per group
# instead of one per key (the client's CPU per request, not the server, is the limit).
READ_GROUP = 64

KEYSPACE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,47}\Z")
DEFAULT_PORT = 9042


def dt_ms(value: datetime | int) -> int:
    """Epoch ms of a driver timestamp (a naive UTC datetime)."""
    if isinstance(value, int):
        return value
    return to_ms(value.replace(tzinfo=UTC))


def replication_map(spec: str) -> str:
    """CQL replication map for ``simple:RF``, ``DC:RF[,DC:RF...]`` or ``nts:DC=RF[,...]``
    (``ConfigError`` for anything else; see ``domain.topology.parse_replication``)."""
    return replication_cql(spec)


# The levels a store URL may name: SERIAL and LOCAL_SERIAL are for lightweight
# transactions only (chosen below), ANY is refused for every read.
CONSISTENCIES = ("LOCAL_QUORUM", "EACH_QUORUM", "QUORUM", "LOCAL_ONE", "ONE", "TWO", "THREE", "ALL")
DC_SOURCES = "--dc, dc= or SCHEDULER_DC"


class CassandraUrl:
    """``cassandra://host[,host2][:port]/keyspace[?local_dc=DC&consistency=LOCAL_QUORUM]``

    ``dc``: the client's DC, given outside the URL (``--dc``, ``dc=``, ``SCHEDULER_DC``);
    it and the URL's ``local_dc`` are one setting, so both given and different is a
    ``ConfigError``. ``consistency``: the level of writes given outside the URL (a
    producer's ``local_quorum`` or ``each_quorum``), the same way against the URL's.

    Resolved here: ``dc`` (None: the driver takes the DC of the first contact point),
    ``write_cl`` (default LOCAL_QUORUM), ``read_cl`` (LOCAL_QUORUM when writes are at
    EACH_QUORUM: a read never waits on a remote DC), ``serial_cl`` (LOCAL_SERIAL with a
    DC, SERIAL without one)."""

    def __init__(self, url: str, *, dc: str | None = None, consistency: str | None = None) -> None:
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
        self.local_dc = None if q.get("local_dc") is None else check_dc(q["local_dc"], "local_dc")
        self.consistency = q.get("consistency", "LOCAL_QUORUM").upper()
        if self.consistency not in CONSISTENCIES:
            raise ConfigError(f"store URL option consistency={q['consistency'][:40]!r} is not one of "
                              f"{', '.join(c.lower() for c in CONSISTENCIES)}")
        self.protocol_version = int(q.get("protocol_version", "5"))
        given_dc = None if dc is None else check_dc(dc, "the DC")
        if given_dc is not None and self.local_dc is not None and given_dc != self.local_dc:
            raise ConfigError(f"the store URL says local_dc={self.local_dc} and {DC_SOURCES} says "
                              f"{given_dc}: the DC is one setting, give it once (or twice the same)")
        self.dc = given_dc or self.local_dc
        write = None if consistency is None else parse_write_consistency(consistency, "the write consistency")
        if write is not None and "consistency" in q and write.upper() != self.consistency:
            raise ConfigError(f"the store URL says consistency={self.consistency.lower()} and the client's "
                              f"write consistency is {write}: give it once (or twice the same)")
        self.write_cl = write.upper() if write is not None else self.consistency
        self.read_cl = "LOCAL_QUORUM" if self.write_cl == "EACH_QUORUM" else self.write_cl
        self.serial_cl = "LOCAL_SERIAL" if self.dc is not None else "SERIAL"


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
