"""Settings from the environment, read in one place and only when asked (never at import).

| variable | default | meaning |
|---|---|---|
| SCHEDULER_STORE | (none) | store URL, ``cassandra://...`` or ``sqlite:///...`` |
| SCHEDULER_COORDINATOR | local | ``zookeeper://h1:2181,h2:2181/root`` or ``local`` |
| SCHEDULER_DC | (none) | this process's Cassandra DC (``--dc``, ``dc=`` win; the URL's local_dc must agree) |
| SCHEDULER_WRITE_CONSISTENCY | (none) | producers: ``local_quorum`` (default) or ``each_quorum`` |
| SCHEDULER_MAX_PAYLOAD_BYTES | 65536 | payload size limit checked before writing |
| SCHEDULER_LAYOUT_CACHE_TTL_S | 30 | how long producers (and occurrence writers) may use cached layouts |
| SCHEDULER_LOAD_CONCURRENCY | 128 | requests in flight for bulk loads (old name: SCHEDULER_CONCURRENCY) |
| SCHEDULER_METRICS_ADDRESS | 127.0.0.1:9460 | where `scheduler run` serves /metrics; ``off`` for none |
| SCHEDULER_NOTIFY_ADDRESS | 127.0.0.1:0 | where a poller listens for nudges (UDP); ``off``: none |
| SCHEDULER_NUDGE | on | whether producers nudge owners about due-now jobs; ``off`` for never |
| SCHEDULER_CASSANDRA_USER | (none) | Cassandra login (a user in the store URL wins) |
| SCHEDULER_CASSANDRA_PASSWORD_FILE | (none) | file holding its password, re-read on each new connection |
| SCHEDULER_CASSANDRA_PASSWORD | (none) | the password itself (the file is preferred) |
| SCHEDULER_CASSANDRA_CA | (none) | CA file (PEM): turns TLS on and trusts only that CA |
| SCHEDULER_CASSANDRA_TLS | false | TLS with the system's CAs, when no CA file is given |
| SCHEDULER_CASSANDRA_CERT, SCHEDULER_CASSANDRA_KEY | (none) | client certificate and key (PEM) |
| SCHEDULER_CASSANDRA_VERIFY_HOSTNAME | true | ``false`` accepts any name (logged as a warning) |
| SCHEDULER_ZK_CA, SCHEDULER_ZK_TLS, SCHEDULER_ZK_CERT, SCHEDULER_ZK_KEY | | the same for ZooKeeper |
| SCHEDULER_ZK_VERIFY_HOSTNAME | true | |
| SCHEDULER_ZK_AUTH_FILE / SCHEDULER_ZK_AUTH | (none) | ``user:password`` digest credentials |
| SCHEDULER_CONSOLE_TOKEN_FILE / SCHEDULER_CONSOLE_TOKEN | (none) | the token that unlocks the console's |
| | | actions (``scheduler console --allow-actions``); at least 16 characters |
| SCHEDULER_API_TOKENS_FILE | (none) | ``scheduler api``'s tokens: one ``ROLE TOKEN`` line each, ROLE |
| | | producer, reader or admin, tokens of at least 16 characters |
| SCHEDULER_ZK_READERS | (none) | digest ids ``user:base64(sha1(user:password))``, comma- |
| | | separated, given read-only access to the znodes a poller creates |
| SCHEDULER_HTTP_ALLOW | (none) | HTTP targets: hosts, ``host:port`` pairs and CIDR networks, comma- |
| | | separated, excepted from the guard against private and loopback addresses |
| SCHEDULER_HTTP_SIGNING_SECRET_FILE | (none) | pollers: the file holding the secret that signs |
| | | HTTP targets' requests (at least 16 characters) |
| SCHEDULER_DEBUG | (off) | ``1``: the CLI prints the traceback of an unexpected error |
| SCHEDULER_TRACING | on | ``off``: no spans whatever the OTEL_* variables say (``tracing_settings``) |
| SCHEDULER_GC_THRESHOLDS | poller | pollers: the collector's ``poller`` thresholds, ``keep``, or ``A,B,C`` |
| OTEL_EXPORTER_OTLP_TRACES_ENDPOINT | (none) | where spans go (OTLP); tracing is on only when set, |
| / OTEL_EXPORTER_OTLP_ENDPOINT | | or the other one (``/v1/traces`` appended) is |
| OTEL_EXPORTER_OTLP_TRACES_PROTOCOL | http/protobuf | ``http/protobuf``, or ``grpc`` (its exporter |
| / OTEL_EXPORTER_OTLP_PROTOCOL | | package installed) |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from .domain.address import ADDRESS_FORM, parse_address
from .domain.model import DEFAULT_MAX_PAYLOAD_BYTES
from .domain.netguard import AllowList, parse_allow
from .domain.topology import check_dc, parse_write_consistency
from .errors import ConfigError, InvalidInput
from .security import CassandraSecurity, Secret, TlsConfig, ZkSecurity


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be at least {minimum}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if raw == "":
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean; use true or false")


def _tls(env: Mapping[str, str], prefix: str) -> TlsConfig | None:
    """TLS toward one service: on when a CA file is given or ``<prefix>_TLS`` is true."""
    ca = env.get(f"{prefix}_CA") or None
    cert, key = env.get(f"{prefix}_CERT") or None, env.get(f"{prefix}_KEY") or None
    if not (ca or _bool(env, f"{prefix}_TLS", False)):
        if cert or key:
            raise ConfigError(f"{prefix}_CERT/_KEY are set but TLS is off: set {prefix}_CA "
                              f"(or {prefix}_TLS=true)")
        return None
    return TlsConfig(ca=ca, cert=cert, key=key,
                     verify_hostname=_bool(env, f"{prefix}_VERIFY_HOSTNAME", True), prefix=prefix)


def cassandra_security(env: Mapping[str, str] | None = None) -> CassandraSecurity:
    """Credentials and TLS toward Cassandra from the environment. Nothing is read from
    the password file yet: it is read on each new connection."""
    env = os.environ if env is None else env
    password = None
    if env.get("SCHEDULER_CASSANDRA_PASSWORD_FILE"):
        password = Secret(path=env["SCHEDULER_CASSANDRA_PASSWORD_FILE"])
    elif env.get("SCHEDULER_CASSANDRA_PASSWORD"):
        password = Secret(value=env["SCHEDULER_CASSANDRA_PASSWORD"])
    return CassandraSecurity(user=env.get("SCHEDULER_CASSANDRA_USER") or None, password=password,
                             tls=_tls(env, "SCHEDULER_CASSANDRA"))


def zookeeper_security(env: Mapping[str, str] | None = None) -> ZkSecurity:
    """TLS toward ZooKeeper from the environment (digest credentials: ``zookeeper_credentials``)."""
    env = os.environ if env is None else env
    readers = tuple(r.strip() for r in env.get("SCHEDULER_ZK_READERS", "").split(",") if r.strip())
    for reader in readers:
        user, _, digest = reader.partition(":")
        # Not a password: the digest of one (a secret here would be a mistake worth naming).
        if not user or len(digest) != 28 or not digest.endswith("="):
            raise ConfigError(f"SCHEDULER_ZK_READERS holds {user or '?'}:<...>, not a digest id: give "
                              "user:base64(sha1(user:password)) (ops/secure-stack env prints one)")
    return ZkSecurity(tls=_tls(env, "SCHEDULER_ZK"), readers=readers)


def _secret(env: Mapping[str, str], name: str, file_first: bool) -> str | None:
    """``name``'s value, or the contents of the file named by ``name_FILE`` (stripped),
    whichever is set first in the given order; None when neither is. ``ConfigError``
    names the variable of a file that cannot be read or is not UTF-8 (never its contents)."""
    for key in ((f"{name}_FILE", name) if file_first else (name, f"{name}_FILE")):
        if not env.get(key):
            continue
        if not key.endswith("_FILE"):
            return env[key].strip()
        try:
            with open(env[key], encoding="utf-8") as fh:
                return fh.read().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read {key}: {exc.strerror}") from None
        except UnicodeDecodeError:  # its message holds a byte of the secret and where: never shown
            raise ConfigError(f"the file named by {key} is not UTF-8 text: write the secret in it "
                              "as UTF-8, or choose another secret in plain ASCII") from None
    return None


def zookeeper_credentials(env: Mapping[str, str] | None = None) -> str | None:
    """``user:password`` for ZooKeeper digest auth from ``SCHEDULER_ZK_AUTH`` or the file
    named by ``SCHEDULER_ZK_AUTH_FILE``; never from the command line."""
    cred = _secret(os.environ if env is None else env, "SCHEDULER_ZK_AUTH", file_first=False)
    if cred is None:
        return None
    if ":" not in cred or cred.startswith(":"):
        raise ConfigError("ZooKeeper credentials must look like user:password")
    return cred


CONSOLE_TOKEN_MIN = 16


def console_token(env: Mapping[str, str] | None = None) -> str | None:
    """The console's action token from the file named by ``SCHEDULER_CONSOLE_TOKEN_FILE``
    (preferred) or ``SCHEDULER_CONSOLE_TOKEN``; None when neither is set. Raises
    ``ConfigError`` for an unreadable file or a token too short to resist guessing."""
    token = _secret(os.environ if env is None else env, "SCHEDULER_CONSOLE_TOKEN", file_first=True)
    if token is None:
        return None
    if len(token) < CONSOLE_TOKEN_MIN:
        raise ConfigError(f"the console token must be at least {CONSOLE_TOKEN_MIN} characters; "
                          "make one with: openssl rand -hex 24")
    return token


API_TOKEN_MIN = 16
API_ROLES = ("producer", "reader", "admin")


def api_tokens(env: Mapping[str, str] | None = None) -> list[tuple[str, str, int]]:
    """``(role, token, line number)`` for each ``ROLE TOKEN`` line of the file named by
    ``SCHEDULER_API_TOKENS_FILE`` (blank lines and ``#`` comments skipped). Raises
    ``ConfigError`` naming the file and the line for an unset variable, an unreadable
    file, a line that is not two words, an unknown role, a token shorter than 16
    characters or not printable ASCII, a token given twice, or no token at all. No
    message ever holds a word of a line: either word may be a token."""
    env = os.environ if env is None else env
    path = env.get("SCHEDULER_API_TOKENS_FILE")
    if not path:
        raise ConfigError("set SCHEDULER_API_TOKENS_FILE to a file of `ROLE TOKEN` lines (ROLE: producer, "
                          "reader or admin; make a token with: openssl rand -hex 24)")
    where = f"SCHEDULER_API_TOKENS_FILE {path}"
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ConfigError(f"cannot read {where}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:  # its message holds the bytes: only the line is named
        bad = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{where}, line {bad}: not UTF-8 text") from None
    out: list[tuple[str, str, int]] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(text.split("\n"), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) != 2:
            raise ConfigError(f"{where}, line {n}: expected two words, `ROLE TOKEN` (a token holds no space)")
        role, token = words
        if role not in API_ROLES:
            raise ConfigError(f"{where}, line {n}: the first word must be a role, producer, reader or "
                              "admin, then the token")
        if len(token) < API_TOKEN_MIN:
            raise ConfigError(f"{where}, line {n}: the token is shorter than {API_TOKEN_MIN} characters; "
                              "make one with: openssl rand -hex 24")
        if not all("!" <= c <= "~" for c in token):
            raise ConfigError(f"{where}, line {n}: the token holds a character that is not printable "
                              "ASCII (use letters, digits and punctuation)")
        if token in seen:
            raise ConfigError(f"{where}, line {n}: the same token as line {seen[token]}; give each "
                              "token one role")
        seen[token] = n
        out.append((role, token, n))
    if not out:
        raise ConfigError(f"{where} holds no token: add a line such as `producer <token>`")
    return out


SIGNING_SECRET_MIN = 16


def http_allow(env: Mapping[str, str] | None = None) -> AllowList:
    """``SCHEDULER_HTTP_ALLOW`` (see ``netguard.parse_allow``); empty when unset.
    ``ConfigError`` names the first bad entry."""
    raw = (os.environ if env is None else env).get("SCHEDULER_HTTP_ALLOW") or ""
    try:
        return parse_allow(raw)
    except InvalidInput as exc:
        raise ConfigError(f"SCHEDULER_HTTP_ALLOW: {exc}") from None


def http_signing_secret(path: str) -> bytes:
    """The signing secret of HTTP targets: the text of the file at ``path`` (named by
    ``SCHEDULER_HTTP_SIGNING_SECRET_FILE``), surrounding whitespace removed, as UTF-8.
    ``ConfigError`` (never showing any of the file) when it cannot be read, is not UTF-8,
    or holds fewer than ``SIGNING_SECRET_MIN`` characters."""
    secret = _secret({"SCHEDULER_HTTP_SIGNING_SECRET_FILE": path}, "SCHEDULER_HTTP_SIGNING_SECRET",
                     file_first=True) or ""
    if len(secret) < SIGNING_SECRET_MIN:
        raise ConfigError(f"the file named by SCHEDULER_HTTP_SIGNING_SECRET_FILE holds "
                          f"{'nothing' if not secret else 'a secret too short to resist guessing'}: "
                          f"write one of at least {SIGNING_SECRET_MIN} characters, e.g. the output "
                          "of: openssl rand -hex 32")
    return secret.encode("utf-8")


def debug_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether SCHEDULER_DEBUG asks the CLI for tracebacks (1, true, yes or on). Read
    while an error is being reported, so it never raises."""
    raw = ((os.environ if env is None else env).get("SCHEDULER_DEBUG") or "").strip().lower()
    return raw in ("1", "true", "yes", "on")


def _off(value: str) -> str | None:
    return None if value.strip().lower() in ("off", "no", "false", "0") else value


def _address(env: Mapping[str, str], name: str, default: str) -> str | None:
    """``name``'s ``HOST:PORT``, or None for ``off``. Checked here, before anything
    starts: a malformed address otherwise fails only once the poller has joined."""
    value = _off(env.get(name) or default)
    if value is not None:
        try:
            parse_address(value)
        except InvalidInput:
            raise ConfigError(f"{name}={value[:80]!r} is not {ADDRESS_FORM}, or off") from None
    return value


def _switch(env: Mapping[str, str], name: str, default: bool) -> bool:
    """``name`` as on or off (true/false, yes/no, 1/0 too); anything else is refused."""
    try:
        return _bool(env, name, default)
    except ConfigError:
        raise ConfigError(f"{name}={env[name][:40]!r} is neither on nor off") from None


@dataclass(frozen=True)
class Settings:
    store_url: str | None = None
    coordinator: str = "local"
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    layout_cache_ttl_s: int = 30
    # Requests in flight for bulk loads (a poller's handler concurrency: PollerConfig.concurrency).
    load_concurrency: int = 128
    metrics_address: str = "127.0.0.1:9460"
    # Pollers: where to listen for producers' nudges (UDP; ``off``: none). Producers:
    # whether to send them (``SCHEDULER_NUDGE=off``: no). See scheduler/poller/nudge.py.
    notify_address: str | None = "127.0.0.1:0"
    nudge: bool = True
    # HTTP targets: the exceptions to the guard (producers check literal hosts against
    # them, pollers every resolved address), and the file of the pollers' signing secret
    # (read when a poller starts).
    http_allow: AllowList = field(default_factory=AllowList)
    http_signing_secret_file: str | None = None
    # The DC of this process's Cassandra clients, and a producer's write consistency
    # (None: the store URL's, else LOCAL_QUORUM); see docs/two-data-centres.md.
    dc: str | None = None
    write_consistency: str | None = None
    gc_thresholds: str = "poller"  # checked by runtime.gctune.thresholds when a poller starts

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        return cls(
            store_url=env.get("SCHEDULER_STORE") or None,
            coordinator=env.get("SCHEDULER_COORDINATOR") or "local",
            max_payload_bytes=_int(env, "SCHEDULER_MAX_PAYLOAD_BYTES", DEFAULT_MAX_PAYLOAD_BYTES),
            layout_cache_ttl_s=_int(env, "SCHEDULER_LAYOUT_CACHE_TTL_S", 30),
            load_concurrency=_int(env, "SCHEDULER_LOAD_CONCURRENCY",
                                  _int(env, "SCHEDULER_CONCURRENCY", 128)),
            metrics_address=env.get("SCHEDULER_METRICS_ADDRESS") or "127.0.0.1:9460",
            notify_address=_address(env, "SCHEDULER_NOTIFY_ADDRESS", "127.0.0.1:0"),
            nudge=_switch(env, "SCHEDULER_NUDGE", True),
            http_allow=http_allow(env),
            http_signing_secret_file=env.get("SCHEDULER_HTTP_SIGNING_SECRET_FILE") or None,
            dc=check_dc(env["SCHEDULER_DC"], "SCHEDULER_DC") if env.get("SCHEDULER_DC") else None,
            write_consistency=(parse_write_consistency(env["SCHEDULER_WRITE_CONSISTENCY"],
                                                       "SCHEDULER_WRITE_CONSISTENCY")
                               if env.get("SCHEDULER_WRITE_CONSISTENCY") else None),
            gc_thresholds=env.get("SCHEDULER_GC_THRESHOLDS") or "poller",
        )

    def require_store(self, override: str | None = None) -> str:
        url = override or self.store_url
        if not url:
            raise ConfigError(
                "no store given: pass --store URL or set SCHEDULER_STORE "
                "(cassandra://127.0.0.1/scheduler or sqlite:///path/to/file.db)"
            )
        return url


OTLP_PROTOCOLS = ("http/protobuf", "grpc", "http/json")


@dataclass(frozen=True)
class TracingSettings:
    """Whether and where this process exports spans (``scheduler.observe.tracing``).

    ``endpoint``: the OTLP traces URL, None when no endpoint is configured (tracing off).
    ``shown``: the endpoint without credentials, query or fragment, for logs. The exporter
    reads its other standard variables itself (OTEL_EXPORTER_OTLP_HEADERS, timeouts,
    certificates): nothing here holds a header, which may carry a token."""

    enabled: bool = True
    endpoint: str | None = None
    protocol: str = "http/protobuf"
    shown: str = ""


def tracing_settings(env: Mapping[str, str] | None = None) -> TracingSettings:
    """The standard OpenTelemetry variables: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (used as
    given), else OTEL_EXPORTER_OTLP_ENDPOINT (``/v1/traces`` appended, as the OTLP
    specification says); the protocol from OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else
    OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf. ``OTEL_SDK_DISABLED=true``,
    ``OTEL_TRACES_EXPORTER=none`` and ``SCHEDULER_TRACING=off`` turn it off. Raises
    ``ConfigError`` for a protocol that is not an OTLP one or an HTTP endpoint that is not
    an http(s) URL (without showing it: a URL may hold a credential)."""
    env = os.environ if env is None else env
    enabled = _switch(env, "SCHEDULER_TRACING", True)
    if (env.get("OTEL_SDK_DISABLED") or "").strip().lower() == "true" \
            or (env.get("OTEL_TRACES_EXPORTER") or "").strip().lower() == "none":
        enabled = False
    name = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    if not (env.get(name) or "").strip():
        name = "OTEL_EXPORTER_OTLP_PROTOCOL"
    protocol = (env.get(name) or "").strip().lower() or "http/protobuf"
    if protocol not in OTLP_PROTOCOLS:
        raise ConfigError(f"{name}={protocol[:40]!r} is not an OTLP protocol: use http/protobuf "
                          "(or grpc, with its exporter package installed)")
    name, signal_path = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", ""
    endpoint = (env.get(name) or "").strip()
    if not endpoint:
        name, signal_path = "OTEL_EXPORTER_OTLP_ENDPOINT", "" if protocol == "grpc" else "v1/traces"
        endpoint = (env.get(name) or "").strip()
    if not endpoint:
        return TracingSettings(enabled, None, protocol)
    try:
        url = urlsplit(endpoint)
        host, port = url.hostname, url.port
    except ValueError:  # a port that is not a number, a bracket left open
        url, host, port = None, None, None
    if protocol != "grpc" and (url is None or url.scheme not in ("http", "https") or not host):
        raise ConfigError(f"{name} is not an http:// or https:// URL (its value is not shown: it may "
                          "hold a credential); give the collector's, e.g. http://collector:4318")
    shown = "(set)"
    if url is not None and host:
        if signal_path:
            url = url._replace(path=url.path.rstrip("/") + "/" + signal_path)
            endpoint = urlunsplit(url)
        where = f"[{host}]" if ":" in host else host
        shown = f"{url.scheme}://{where}{'' if port is None else f':{port}'}{url.path}"
    return TracingSettings(enabled, endpoint, protocol, shown)
