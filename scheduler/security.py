"""Credentials and TLS for Cassandra and ZooKeeper: the settings' values turned into
driver and kazoo arguments, and a client's connection failures turned into one line
that names the cause and the setting to fix. No connection is made here.

Secrets never leave this module in clear: a password is read from its file on every
new connection (so a rotated password is picked up without a restart) and a
``Secret``'s repr is ``<hidden>``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import AuthenticationError, ConfigError, PermissionDenied, SchedulerError, TlsError

log = logging.getLogger("scheduler.security")

# Which role the README gives each kind of permission (ops/secure-stack creates them).
ROLE_FOR_PERMISSION = {"SELECT": "reader", "MODIFY": "app"}

# A password rotation (ops/secure-stack rotate-password) sets the server's password,
# then replaces the file within milliseconds; and each Cassandra node may accept only
# the old password for as long as its credentials cache lives (credentials_validity,
# 2 s by default). A login refused around a rotation is tried again for that long:
# ROTATION_GAP_S waiting for the file to change (what a wrong password costs a CLI
# before its error), ROTATION_SETTLE_S after the file's change.
ROTATION_GAP_S = 1.0
ROTATION_SETTLE_S = 5.0


@dataclass(frozen=True)
class Secret:
    """A password from a file (re-read on each use) or from the environment."""

    path: str | None = None
    value: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"Secret(path={self.path!r}, value=<hidden>)" if self.path else "Secret(<hidden>)"

    __str__ = __repr__

    def reveal(self, setting: str) -> str:
        """The secret's text; ``ConfigError`` naming ``setting`` (never showing any of the
        file) when its file cannot be read, is not UTF-8 or is empty."""
        if self.path is None:
            return self.value or ""
        try:
            with open(self.path, encoding="utf-8") as fh:
                text = fh.read().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read {setting} ({self.path}): {exc.strerror}") from None
        except UnicodeDecodeError:  # its message holds a byte of the secret and where: never shown
            raise ConfigError(f"the file named by {setting} ({self.path}) is not UTF-8 text: write the "
                              "password in it as UTF-8, or choose one in plain ASCII") from None
        if not text:
            raise ConfigError(f"{setting} ({self.path}) is empty; write the password in it")
        return text

    def fingerprint(self) -> str | None:
        """What the file holds now (None when unreadable or not a file): compared after a
        refused login to tell a rotation in progress from a wrong password."""
        if self.path is None:
            return None
        try:
            return self.reveal(_PASSWORD_SETTING)
        except ConfigError:  # unreadable or empty (mid-write)
            return None

    def rotating(self, before: str | None, *, gap_s: float = ROTATION_GAP_S,
                 settle_s: float = ROTATION_SETTLE_S, sleep: Callable[[float], None] = time.sleep) -> bool:
        """Whether a login refused with the password read as ``before`` may be a rotation
        in progress, so worth another try: the file was replaced less than ``settle_s``
        ago (the server may still accept only the old password while its credentials
        cache lives), or it changes within ``gap_s`` (a rotation sets the server first
        and the file just after). False at once for a password from the environment."""
        if self.path is None:
            return False
        waited = 0.0
        while True:
            try:
                age = time.time() - os.stat(self.path).st_mtime
            except OSError:
                return False
            if age < settle_s or self.fingerprint() not in (before, None):
                return True
            if waited >= gap_s:
                return False
            sleep(0.1)
            waited += 0.1


@dataclass(frozen=True)
class TlsConfig:
    """TLS toward one service. ``ca`` None: the system's trusted CAs."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    verify_hostname: bool = True
    prefix: str = "SCHEDULER_CASSANDRA"  # names the settings in error messages

    def context(self) -> ssl.SSLContext:
        """A client context: the CA checked, the hostname checked unless turned off (then
        a warning is logged), the client certificate loaded when given. ``ConfigError``
        naming the setting when a file is unreadable or not PEM."""
        try:
            ctx = ssl.create_default_context(cafile=self.ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load {self.prefix}_CA ({self.ca}): {_reason(exc)}") from None
        if self.cert or self.key:
            if not (self.cert and self.key):
                raise ConfigError(f"set both {self.prefix}_CERT and {self.prefix}_KEY, or neither")
            try:
                ctx.load_cert_chain(self.cert, self.key)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"cannot load {self.prefix}_CERT/{self.prefix}_KEY "
                                  f"({self.cert}, {self.key}): {_reason(exc)}") from None
        if not self.verify_hostname:
            ctx.check_hostname = False
            log.warning("hostname verification is off (%s_VERIFY_HOSTNAME=false): any server with a "
                        "certificate from the CA is accepted; never do this in production", self.prefix,
                        extra={"action": "tls_hostname_unchecked"})
        return ctx


@dataclass(frozen=True)
class CassandraSecurity:
    user: str | None = None
    password: Secret | None = None
    tls: TlsConfig | None = None

    def auth_provider(self, user: str | None) -> Any:
        """The driver's auth provider for ``user`` (the URL's, else the setting's), or None.
        The password is read again for every new connection."""
        user = user or self.user
        if user is None:
            if self.password is not None:
                raise ConfigError("a Cassandra password is set but no user: put one in the store URL "
                                  "(cassandra://USER@HOST/KEYSPACE) or set SCHEDULER_CASSANDRA_USER")
            return None
        if self.password is None:
            raise ConfigError(f"no password for Cassandra user {user!r}: set "
                              "SCHEDULER_CASSANDRA_PASSWORD_FILE (or SCHEDULER_CASSANDRA_PASSWORD)")
        self.password.reveal(_PASSWORD_SETTING)  # fail now, with the setting's name
        return _file_auth_provider(user, self.password)


@dataclass(frozen=True)
class ZkSecurity:
    tls: TlsConfig | None = None
    # Digest ids (user:base64 sha1) given READ on the znodes this process creates: the
    # reader role's views see the fleet without the rights to change it.
    readers: tuple[str, ...] = ()

    def acl(self, credentials: str | None) -> list[Any] | None:
        """The ACL of the znodes a fleet member creates: everything for its own digest
        user, read for the readers. None (open) without credentials."""
        from kazoo.security import make_acl, make_digest_acl

        if not credentials:
            return None
        user, _, password = credentials.partition(":")
        return [make_digest_acl(user, password, all=True),
                *(make_acl("digest", reader, read=True) for reader in self.readers)]

    def kazoo_args(self) -> dict[str, Any]:
        """Keyword arguments for ``KazooClient`` (none without TLS)."""
        if self.tls is None:
            return {}
        if not self.tls.verify_hostname:
            self.tls.context()  # the warning, and the files checked early
        args: dict[str, Any] = {"use_ssl": True, "verify_certs": True, "ca": self.tls.ca,
                                "check_hostname": self.tls.verify_hostname}
        if self.tls.cert or self.tls.key:
            if not (self.tls.cert and self.tls.key):
                raise ConfigError("set both SCHEDULER_ZK_CERT and SCHEDULER_ZK_KEY, or neither")
            for name, path in (("SCHEDULER_ZK_CERT", self.tls.cert), ("SCHEDULER_ZK_KEY", self.tls.key)):
                if not os.access(path, os.R_OK):
                    raise ConfigError(f"cannot read {name} ({path})")
            args.update(certfile=self.tls.cert, keyfile=self.tls.key)
        return args


_PASSWORD_SETTING = "SCHEDULER_CASSANDRA_PASSWORD_FILE"


def _file_auth_provider(user: str, password: Secret) -> Any:
    from cassandra.auth import AuthProvider, PlainTextAuthenticator

    class FileAuthProvider(AuthProvider):  # type: ignore[misc]
        def new_authenticator(self, host: Any) -> Any:
            return PlainTextAuthenticator(user, password.reveal(_PASSWORD_SETTING))

        def __repr__(self) -> str:
            return f"FileAuthProvider(user={user!r}, password=<hidden>)"

    return FileAuthProvider()


def is_loopback(hosts: str) -> bool:
    """True when every ``host[:port]`` of a comma-separated list is a loopback address."""
    for item in hosts.split(","):
        host = item.rsplit(":", 1)[0].strip("[]") if item.count(":") <= 1 else item.strip("[]")
        if host == "localhost":
            continue
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return False
        except ValueError:
            return False
    return True


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return str(exc.verify_message or exc.reason)
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


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
    from urllib.parse import urlsplit

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
    import socket

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
    import socket

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
