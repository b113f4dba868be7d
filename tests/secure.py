"""The secured stack (ops/secure-stack) as tests see it: each role's settings, a fresh
keyspace that the admin role creates and grants to app and reader, and every secret
the stack generated (for the grep that proves none is printed)."""

from __future__ import annotations

import shlex
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

from scheduler import queries
from scheduler.settings import cassandra_security
from scheduler.store import SchemaOptions
from scheduler.store.cassandra import CassandraStore

ROOT = Path(__file__).parents[1]
SECURE_DIR = ROOT / ".data" / "secure"
CQL_PORT, ZK_PORT = 9142, 2281


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


def secrets() -> list[str]:
    """Every password and key the stack generated (each long and random: a plain
    substring search of any output finds it)."""
    # (*.id: a ZooKeeper digest id, a hash and no secret, printed by `env` on purpose.)
    found = [p.read_text().strip() for p in (SECURE_DIR / "secrets").glob("*")
             if p.is_file() and p.suffix != ".id"]
    found += [s.partition(":")[2] for s in found if ":" in s]  # the ZooKeeper digest's password
    key = (SECURE_DIR / "tls" / "client.key").read_text()
    found += [line for line in key.splitlines() if line and not line.startswith("-----")][:3]
    return [s for s in found if len(s) >= 16]


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
