"""Opening the Cassandra store's driver session: the execution profile, the login and
TLS from the settings, and a failed connection turned into one typed line."""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from typing import Any

from ...diagnose import explain_cassandra, first_cause
from ...errors import AuthenticationError, ConfigError, StoreUnavailable
from ...security import ROTATION_GAP_S, ROTATION_SETTLE_S, CassandraSecurity
from .conf import CassandraUrl
from .policy import IdempotentRetryPolicy, reconnection_policy

log = logging.getLogger("scheduler.store")


def connect(cfg: CassandraUrl, sec: CassandraSecurity, *, request_timeout_s: float,
            connect_timeout_s: float) -> tuple[Any, Any]:
    """``(cluster, session)`` for ``cfg``. Raises ``StoreUnavailable`` when no host answers,
    ``AuthenticationError`` or ``TlsError`` (one line naming the setting to fix) when the
    login or the handshake fails, ``ConfigError`` for a bad setting. Nothing stays open
    after a failure."""
    from cassandra import ConsistencyLevel, UnresolvableContactPoints
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
    from cassandra.query import tuple_factory

    # The default level is the write level: batches and plain writes take it; the store
    # sets reads' and lightweight transactions' own levels on their prepared statements.
    profile = ExecutionProfile(
        load_balancing_policy=load_balancing(cfg.dc),
        retry_policy=IdempotentRetryPolicy(),
        consistency_level=ConsistencyLevel.name_to_value[cfg.write_cl],
        serial_consistency_level=ConsistencyLevel.name_to_value[cfg.serial_cl],
        request_timeout=request_timeout_s,
        row_factory=tuple_factory,
    )
    where = f"{','.join(cfg.hosts)}:{cfg.port}"
    give_up = time.monotonic() + ROTATION_GAP_S + ROTATION_SETTLE_S
    while True:
        password_before = sec.password.fingerprint() if sec.password is not None else None
        try:
            cluster = Cluster(
                cfg.hosts, port=cfg.port, protocol_version=cfg.protocol_version,
                execution_profiles={EXEC_PROFILE_DEFAULT: profile}, connect_timeout=connect_timeout_s,
                reconnection_policy=reconnection_policy(), auth_provider=sec.auth_provider(cfg.user),
                ssl_context=sec.tls.context() if sec.tls is not None else None,
                # Nagle's algorithm held each request behind the ACK of the one before
                # (Linux delays an ACK up to 40 ms): 48 ms per round of concurrent
                # writes, measured, against 5 ms without. The driver leaves it on by
                # default and documents this option (Cluster.sockopts).
                sockopts=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
            )
        except UnresolvableContactPoints:  # raised before anything is opened
            raise StoreUnavailable(
                f"cannot resolve the Cassandra host name(s) {', '.join(cfg.hosts)} (no address found "
                "for any of them); fix the host in --store / SCHEDULER_STORE, or the DNS"
            ) from None
        try:
            session = cluster.connect()
        except NoHostAvailable as exc:
            # The control connection may have reached the cluster and learnt its hosts,
            # none of them in the DC asked for: the pools all stay closed.
            known = {h.datacenter for h in cluster.metadata.all_hosts()}
            cluster.shutdown()
            if known:
                check_dc_known(cfg.dc, known)
            explained = explain_cassandra(exc, where, cfg.user or sec.user, sec.tls)
            # A login refused around a password rotation (see ROTATION_SETTLE_S) is tried
            # again while the rotation settles. Pools that all failed after the control
            # connection logged in show only as a list of hosts: the same case.
            refused = isinstance(explained, AuthenticationError) or (
                explained is None and not isinstance(exc.errors, dict))
            if (refused and sec.password is not None and time.monotonic() < give_up
                    and sec.password.rotating(password_before)):
                log.info("login refused while the password file is being rotated; trying again")
                time.sleep(0.5)
                continue
            if explained is not None:
                raise explained from None
            raise StoreUnavailable(
                f"cannot reach Cassandra at {where} ({first_cause(exc)}); "
                "start it (ops/cassandra start) or fix --store / SCHEDULER_STORE"
            ) from None
        try:
            check_dc_known(cfg.dc, {h.datacenter for h in cluster.metadata.all_hosts()})
        except BaseException:
            cluster.shutdown()
            raise
        local_control_connection(cluster, cfg.dc)
        return cluster, session


def local_control_connection(cluster: Any, dc: str | None) -> None:
    """Move the driver's control connection into ``dc`` when its first connection went
    to a contact point of another DC (the driver tries them before it knows their DCs).
    Its node's view of the cluster is what the status events tell, and a process of one
    DC asks whether the *other* DCs' nodes are reachable from its own (``peers_down``).
    Afterwards the driver keeps it in ``dc``: the query plan it reconnects from has no
    remote host. Best effort: on failure the connection stays where it is."""
    if dc is None:
        return
    conn = getattr(cluster.control_connection, "_connection", None)
    host = cluster.metadata.get_host(conn.endpoint) if conn is not None else None
    if host is None or host.datacenter == dc:
        return
    with contextlib.suppress(Exception):
        cluster.control_connection.connect()


def load_balancing(dc: str | None) -> Any:
    """Token-aware routing over the hosts of one DC: ``dc``, or (None) the DC of the
    first contact point the driver reaches. No remote host is ever used
    (``used_hosts_per_remote_dc=0``): a request never crosses to another DC on its own."""
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

    return TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=dc, used_hosts_per_remote_dc=0))


def check_dc_known(dc: str | None, known: set[str | None]) -> None:
    """``ConfigError`` when ``dc`` is set and no host of the cluster is in it: every
    request would otherwise fail with "no host available", naming no cause."""
    if dc is not None and dc not in known:
        names = ", ".join(sorted(k for k in known if k)) or "none reported"
        raise ConfigError(f"the cluster has no node in DC {dc!r} (its DCs: {names}); fix --dc, "
                          "SCHEDULER_DC or the store URL's local_dc")
