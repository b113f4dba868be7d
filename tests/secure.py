"""The secured stack (ops/secure-stack) as tests see it: each role's settings and folder,
a fresh keyspace that the admin role creates and grants to app and reader, and every
secret the stack generated (for the grep that proves none is printed)."""

from __future__ import annotations

import shlex
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

from scheduler.settings import cassandra_security
from scheduler.store import SchemaOptions, queries
from scheduler.store.cassandra.store import CassandraStore

ROOT = Path(__file__).parents[1]
SECURE_DIR = ROOT / ".data" / "secure"
CQL_PORT, ZK_PORT = 9142, 2281
ROLES = ("admin", "app", "reader")


def role_env(role: str) -> dict[str, str]:
    """The settings ``ops/secure-stack env --role ROLE`` prints, as a dict."""
    out = subprocess.run([str(ROOT / "ops" / "secure-stack"), "env", "--role", role], check=True,
                         capture_output=True, text=True).stdout
    env: dict[str, str] = {}
    for line in out.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            env[key] = shlex.split(value)[0]
    return env


def role_dir(role: str) -> Path:
    """``role``'s own folder (what a process of that role is given, and nothing else)."""
    return SECURE_DIR / "roles" / role


def secret_files() -> dict[str, Path]:
    """Every file under the stack's folders that holds a secret, by a short name
    (``app:cassandra.pw``, ``server:keystore.pw``, ``ca:ca.p12``...)."""
    return {f"{d.name}:{p.name}": p
            for d in [SECURE_DIR / "ca", SECURE_DIR / "server", *(role_dir(r) for r in ROLES)]
            for p in sorted(d.glob("*"))
            if p.is_file() and p.suffix in (".pw", ".auth", ".key", ".p12")}


def key_lines(pem: str) -> list[str]:
    """Every base64 line of the private key in ``pem``: any printed part of a key that
    is a line long holds one of them."""
    body = pem.split("PRIVATE KEY-----", 1)[1].split("-----END", 1)[0]
    return [line.strip() for line in body.splitlines() if line.strip()]


def server_key() -> str:
    """The servers' private key (PEM), out of their keystore."""
    server = SECURE_DIR / "server"
    return subprocess.run(["openssl", "pkcs12", "-in", str(server / "server.p12"), "-nocerts", "-nodes",
                           "-passin", f"file:{server / 'keystore.pw'}"],
                          check=True, capture_output=True, text=True).stdout


def secrets() -> list[str]:
    """Every password and key the stack generated (each long and random: a plain
    substring search of any output finds it)."""
    # (The digest id in roles/app/zk-readers.id is a hash and no secret, printed by `env`
    # on purpose.)
    found = key_lines(server_key())
    for path in secret_files().values():
        if path.suffix in (".pw", ".auth"):
            value = path.read_text().strip()
            found += [value, value.partition(":")[2]]  # a ZooKeeper digest's password alone too
        elif path.suffix == ".key":
            found += key_lines(path.read_text())
    return sorted({s for s in found if len(s) >= 16})


def url_for(role: str, keyspace: str) -> str:
    return f"cassandra://{role}@localhost:{CQL_PORT}/{keyspace}"


def open_as(role: str, keyspace: str) -> CassandraStore:
    return CassandraStore(url_for(role, keyspace), security=cassandra_security(role_env(role)))


def create_keyspace(name: str, options: SchemaOptions, now_ms: int) -> None:
    """As admin: apply the schema (creating the keyspace), then grant app SELECT and
    MODIFY and reader SELECT on it."""
    admin = open_as("admin", name)
    try:
        admin.apply_schema(options, now_ms)
        grant = queries.named("roles.cql")["grant"]
        for role, perms in (("app", ("SELECT", "MODIFY")), ("reader", ("SELECT",))):
            for perm in perms:
                admin.session.execute(grant.replace("{permission}", perm).replace("{keyspace}", name)
                                      .replace("{role}", role))
    finally:
        admin.close()


def secure_keyspace() -> Iterator[str]:
    """A fresh keyspace name on the secured stack, dropped (by admin) afterwards."""
    name = "s_" + uuid.uuid4().hex[:12]
    yield name
    admin = open_as("admin", name)
    try:
        admin.session.execute(f"DROP KEYSPACE IF EXISTS {name}")
    finally:
        admin.close()
