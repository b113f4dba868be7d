"""A client's connection failures turned into one line that names the cause and the
setting to fix, for Cassandra and ZooKeeper, and the short probes (a TLS handshake, a
plaintext hello) that tell a TLS mismatch from a server that is down. Only the probes
connect, and only when a connection has already failed.
"""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
from urllib.parse import urlsplit

from .errors import AuthenticationError, PermissionDenied, SchedulerError, TlsError
from .security import ROLE_FOR_PERMISSION, TlsConfig


def _walk(exc: BaseException | None) -> list[BaseException]:
    """``exc`` and the exceptions it wraps (cause, context, the driver's per-host errors)."""
    out: list[BaseException] = []
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or e in out:
            continue
        out.append(e)
        todo += [e.__cause__, e.__context__]
        errors = getattr(e, "errors", None)
        if isinstance(errors, dict):
            todo += [v for v in errors.values() if isinstance(v, BaseException)]
    return out


def first_cause(exc: BaseException, limit: int = 160) -> str:
    """The innermost per-host error of a failed connection, on one short line (for an
    outage's message: "timed out", "connection refused")."""
    causes = [e for e in _walk(exc) if e is not exc] or [exc]
    text = " ".join(f"{type(causes[-1]).__name__}: {causes[-1]}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def explain_cassandra(exc: BaseException, where: str, user: str | None,
                      tls: TlsConfig | None) -> SchedulerError | None:
    """One typed error for a failed connection to Cassandra at ``where``, when the cause is
    authentication or TLS; None for an ordinary outage (the caller's own message)."""
    for e in _walk(exc):
        text = str(e)
        name = type(e).__name__
        if isinstance(e, ssl.SSLCertVerificationError):
            return _cert_error(str(e.verify_message or e.reason or e), where, "SCHEDULER_CASSANDRA")
        # The driver keeps only the text of a TLS failure ("Tried connecting to [...].
        # Last error: [SSL: ...] ..."), in an OSError.
        m = _VERIFY_TEXT.search(text)
        if m:
            return _cert_error(m.group(1), where, "SCHEDULER_CASSANDRA")
        if tls is not None and (isinstance(e, ssl.SSLError) or "[SSL:" in text) and _not_tls(e):
            return TlsError(f"Cassandra at {where} does not speak TLS on that port: use its TLS port, "
                            "or unset SCHEDULER_CASSANDRA_CA and SCHEDULER_CASSANDRA_TLS")
        if name == "AuthenticationFailed" or "Bad credentials" in text:
            if "requires authentication" in text:
                return AuthenticationError(
                    f"Cassandra at {where} requires a login: put a user in the store URL "
                    "(cassandra://USER@HOST/KEYSPACE) or set SCHEDULER_CASSANDRA_USER, and set "
                    "SCHEDULER_CASSANDRA_PASSWORD_FILE")
            return AuthenticationError(
                f"Cassandra at {where} refused the login of user {user!r}: unknown user or wrong "
                "password; check the store URL's user (or SCHEDULER_CASSANDRA_USER) and "
                "SCHEDULER_CASSANDRA_PASSWORD_FILE")
    if tls is None and any(_reset(e) for e in _walk(exc)):
        return TlsError(f"Cassandra at {where} closed the connection before it started: it probably "
                        "requires TLS; set SCHEDULER_CASSANDRA_CA to the CA file of its certificate")
    return None


ZK_DEFAULT_PORT = 2181


def first_address(hosts: str) -> tuple[str, int]:
    """The first ``HOST[:PORT]`` of a ZooKeeper host list (as kazoo reads it: a name, an
    IPv4 address or a bracketed IPv6 one; port 2181 when none is given) as (host without
    brackets, port). ``ValueError`` when it is not one."""

    parsed = urlsplit("zk://" + hosts.split(",")[0].strip())
    port = parsed.port  # ValueError for a port that is not a number in 0-65535
    if not parsed.hostname:
        raise ValueError(f"no host in {hosts!r}")
    return parsed.hostname, ZK_DEFAULT_PORT if port is None else port


def probe_tls(hosts: str, tls: TlsConfig, timeout_s: float = 3.0) -> BaseException | None:
    """Open one TLS connection to the first ``host:port`` and read from it: the handshake's
    error, or the server's alert (a missing client certificate shows only on the first
    read under TLS 1.3), or None when the connection works. kazoo retries TLS failures
    in silence and reports a timeout; this finds the cause."""

    try:
        host, port = first_address(hosts)
        ctx = tls.context()
        # The handshake inside the with: a failed one still closes the socket.
        with socket.create_connection((host, port), timeout=timeout_s) as raw, \
                ctx.wrap_socket(raw, server_hostname=host, do_handshake_on_connect=False) as conn:
            conn.do_handshake()
            conn.settimeout(0.5)
            with contextlib.suppress(TimeoutError):  # a server waiting for our first request
                conn.recv(1)
            return None
    except Exception as exc:
        return exc


def explain_zookeeper(exc: BaseException, where: str, tls: TlsConfig | None) -> SchedulerError | None:
    """As ``explain_cassandra``, for a ZooKeeper connection that failed or timed out."""
    if tls is not None and type(exc).__name__ == "KazooTimeoutError":
        probed = probe_tls(where, tls)
        if probed is not None:
            alert = str(probed).upper()
            refused = "CERTIFICATE_REQUIRED" in alert or "BAD_CERTIFICATE" in alert
            if isinstance(probed, ssl.SSLError) and refused:
                if not (tls.cert and tls.key):
                    return TlsError(f"ZooKeeper at {where} requires a client certificate: set "
                                    "SCHEDULER_ZK_CERT and SCHEDULER_ZK_KEY (kazoo reports this only "
                                    "as a time-out)")
                return TlsError(f"ZooKeeper at {where} rejected the client certificate in SCHEDULER_ZK_CERT: "
                                "use one signed by a CA in the server's trust store")
            exc = probed
    for e in _walk(exc):
        if isinstance(e, ssl.SSLCertVerificationError):
            return _cert_error(str(e.verify_message or e.reason or e), where, "SCHEDULER_ZK")
        if isinstance(e, ssl.SSLError) and tls is not None and _not_tls(e):
            return TlsError(f"ZooKeeper at {where} does not speak TLS on that port: use its "
                            "secureClientPort, or unset SCHEDULER_ZK_CA and SCHEDULER_ZK_TLS")
    if tls is None and any(_reset(e) or type(e).__name__ == "KazooTimeoutError" for e in _walk(exc)) \
            and probe_plain_is_tls(where):
        return TlsError(f"ZooKeeper at {where} speaks only TLS on that port: set SCHEDULER_ZK_CA, "
                        "SCHEDULER_ZK_CERT and SCHEDULER_ZK_KEY")
    return None


def probe_plain_is_tls(hosts: str, timeout_s: float = 3.0) -> bool:
    """True when the first ``host:port`` answers a TLS ClientHello with a TLS handshake
    (a plaintext client there sees only a dropped connection or a timeout)."""

    try:
        host, port = first_address(hosts)
    except ValueError:
        return False  # not an address this probe can reach: kazoo's own error stands
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw, \
                ctx.wrap_socket(raw, server_hostname=host, do_handshake_on_connect=False) as conn:
            conn.do_handshake()
            return True
    except ssl.SSLError as exc:
        return any(k in str(exc).upper() for k in ("CERTIFICATE_REQUIRED", "BAD_CERTIFICATE"))
    except OSError:
        return False


def explain_unauthorized(message: str) -> PermissionDenied:
    """A server's ``Unauthorized`` as one line naming the permission and the role to use."""
    m = re.search(r"User (\S+) has no (\w+) permission on <([^>]+)>", message)
    if m is None:
        return PermissionDenied(f"Cassandra refused the request: {message}; run it as a role that has "
                                "the permission (see the README's Security section)")
    user, perm, resource = m.groups()
    role = ROLE_FOR_PERMISSION.get(perm.upper(), "admin")
    return PermissionDenied(f"user {user!r} lacks the {perm.upper()} permission on {resource}: "
                            f"run this command as the {role} role (ops/secure-stack env --role {role})")


_VERIFY_TEXT = re.compile(r"certificate verify failed: (.+?)\.? \(_ssl")


def _cert_error(why: str, where: str, prefix: str) -> TlsError:
    service = "Cassandra" if prefix == "SCHEDULER_CASSANDRA" else "ZooKeeper"
    if "expired" in why:
        return TlsError(f"the certificate of {service} at {where} has expired: renew the server's "
                        "certificate (ops/secure-stack renew-cert)")
    if "mismatch" in why or "hostname" in why.lower():
        return TlsError(f"the certificate of {service} at {where} is not valid for that address ({why}): "
                        f"connect by a name or address in the certificate, or set "
                        f"{prefix}_VERIFY_HOSTNAME=false (never in production)")
    return TlsError(f"the certificate of {service} at {where} is not trusted ({why}): set {prefix}_CA "
                    "to the CA file that signed it")


def _not_tls(e: BaseException) -> bool:
    reason = str(getattr(e, "reason", "") or e).upper()
    return any(k in reason for k in ("WRONG_VERSION_NUMBER", "RECORD_LAYER", "UNEXPECTED_EOF",
                                     "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"))


def _reset(e: BaseException) -> bool:
    text = str(e).lower()
    return (isinstance(e, ConnectionResetError) or "connection reset" in text
            or type(e).__name__ == "ConnectionShutdown")
