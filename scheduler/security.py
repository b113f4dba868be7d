"""Credentials and TLS for Cassandra and ZooKeeper: the settings' values turned into
driver and kazoo arguments (what a refused connection means is in ``diagnose``). No
connection is made here.

Secrets never leave this module in clear: a password is read from its file on every
new connection (so a rotated password is picked up without a restart) and a
``Secret``'s repr is ``<hidden>``.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

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
            raise ConfigError(f"cannot load {self.prefix}_CA ({self.ca}): {reason(exc)}") from None
        if self.cert or self.key:
            if not (self.cert and self.key):
                raise ConfigError(f"set both {self.prefix}_CERT and {self.prefix}_KEY, or neither")
            try:
                ctx.load_cert_chain(self.cert, self.key)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"cannot load {self.prefix}_CERT/{self.prefix}_KEY "
                                  f"({self.cert}, {self.key}): {reason(exc)}") from None
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


def reason(exc: BaseException) -> str:
    """The most telling text of a TLS or socket error."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return str(exc.verify_message or exc.reason)
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)
