"""The Python half of ops/secure-stack: wait for the TLS ZooKeeper, create the roles on
the secured Cassandra node, rotate a role's password. Secrets are read from and written
to the roles' folders (``roles/ROLE/cassandra.pw`` under ``--dir``) and never printed.

    python ops/secure_setup.py --dir .data/secure [--host H] [--keyspace scheduler] \
        wait-zk|roles|rotate-password ROLE

``--host``: the servers' address (default 127.0.0.1; ``cassandra`` in the compose override,
where the roles' folders are mounted at /secure/roles and the servers are the containers).
Creating the logins and rotating a password are the admin's work: they read the admin's
folder and write the password file of the role concerned, nothing else.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from scheduler.store import queries

CQL_PORT = 9142
ZK_PORT = 2281
HOST = "127.0.0.1"  # --host sets it


def host_name() -> str:
    """The name in the servers' certificate for HOST."""
    return "localhost" if HOST == "127.0.0.1" else HOST


def role_dir(folder: Path, role: str) -> Path:
    """``role``'s own folder: its password, certificate, key and the CA certificate."""
    return folder / "roles" / role


def password(folder: Path, role: str) -> str:
    return (role_dir(folder, role) / "cassandra.pw").read_text().strip()


ROLES = ("admin", "app", "reader")
GRANTS = {"app": ("SELECT", "MODIFY"), "reader": ("SELECT",)}


def say(msg: str) -> None:
    print(f"[secure-stack] {msg}", file=sys.stderr, flush=True)


def session(folder: Path, user: str, password: str, deadline_s: float = 120.0):
    """A driver session over TLS as ``user``; retried while the node finishes starting
    (the default superuser appears a moment after the port opens)."""
    import ssl

    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import Cluster, NoHostAvailable

    ctx = ssl.create_default_context(cafile=str(role_dir(folder, "admin") / "ca.pem"))
    end = time.monotonic() + deadline_s
    while True:
        cluster = Cluster([HOST], port=CQL_PORT, ssl_context=ctx, protocol_version=5,
                          auth_provider=PlainTextAuthProvider(user, password))
        try:
            return cluster, cluster.connect()
        except NoHostAvailable as exc:
            cluster.shutdown()
            if time.monotonic() > end:
                raise SystemExit(f"cannot log in to the secured Cassandra as {user}: "
                                 f"{type(next(iter(exc.errors.values()), exc)).__name__}") from None
            time.sleep(1)


def cql(name: str, **fill: str) -> str:
    text = queries.named("roles.cql")[name]
    for key, value in fill.items():
        if not value.replace("_", "").isalnum():  # identifiers and generated hex only
            # (Never the value: it may be a password.)
            raise SystemExit(f"refusing to put the {key} into CQL: only letters, digits and _ are allowed")
        text = text.replace("{" + key + "}", value)
    return text


def roles(folder: Path, keyspace: str) -> None:
    admin_dir = role_dir(folder, "admin")
    # In the admin's folder: the compose override mounts it writable for this job only.
    marker = admin_dir / ("logins.done" if HOST == "127.0.0.1" else f"logins-{HOST}.done")
    if marker.exists():
        say("roles exist already")
        return
    pw = {r: password(folder, r) for r in ROLES}
    cluster, s = session(folder, "cassandra", "cassandra")
    s.execute(cql("create_superuser", role="admin", password=pw["admin"]))
    cluster.shutdown()
    cluster, s = session(folder, "admin", pw["admin"])
    s.execute(cql("drop_default_superuser"))
    for role in ("app", "reader"):
        s.execute(cql("create_login", role=role, password=pw[role]))
    # The keyspace is created by the admin role through the scheduler itself.
    env = {**os.environ, "SCHEDULER_STORE": f"cassandra://admin@{host_name()}:{CQL_PORT}/{keyspace}",
           "SCHEDULER_CASSANDRA_PASSWORD_FILE": str(admin_dir / "cassandra.pw"),
           "SCHEDULER_CASSANDRA_CA": str(admin_dir / "ca.pem")}
    subprocess.run([sys.executable, "-P", "-m", "scheduler", "schema", "apply", "--shards", "8"], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    for role, perms in GRANTS.items():
        for perm in perms:
            s.execute(cql("grant", permission=perm, keyspace=keyspace, role=role))
    cluster.shutdown()
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("admin app reader\n")
    say(f"roles admin (superuser), app (SELECT, MODIFY on {keyspace}), reader (SELECT on {keyspace}); "
        "default superuser dropped")


def rotate(folder: Path, role: str) -> None:
    """A new password: set on the server first, then written to the role's file (atomic
    rename). Processes read the file on each new connection; open ones stay logged in."""
    if role not in ROLES:
        raise SystemExit(f"unknown role {role!r}: use one of {', '.join(ROLES)}")
    target = role_dir(folder, role) / "cassandra.pw"
    admin_pw = password(folder, "admin")
    new = secrets.token_hex(16)
    tmp = target.with_name(".cassandra.pw.new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(new + "\n")
    cluster, s = session(folder, "admin", admin_pw)
    try:
        s.execute(cql("set_password", role=role, password=new))
        # Right after the server has it: a client logging in between the two sees the
        # old file and a refusal, and waits for the file to change (ROTATION_GAP_S).
        os.replace(tmp, target)
    finally:
        cluster.shutdown()
        tmp.unlink(missing_ok=True)
    say(f"password of {role} rotated; new connections use it")


def wait_zk(folder: Path, deadline_s: float = 60.0) -> None:
    from kazoo.client import KazooClient

    tls = role_dir(folder, "admin")  # any role's certificate would do: the admin's is the stack's own
    end = time.monotonic() + deadline_s
    while True:
        zk = KazooClient(hosts=f"{host_name()}:{ZK_PORT}", use_ssl=True, ca=str(tls / "ca.pem"),
                         certfile=str(tls / "client.crt"), keyfile=str(tls / "client.key"), verify_certs=True)
        try:
            zk.start(timeout=5)
            zk.stop()
            zk.close()
            say("zookeeper answers over TLS")
            return
        except Exception:
            zk.close()
            if time.monotonic() > end:
                raise SystemExit("the TLS ZooKeeper did not answer in 60 s; "
                                 "see .data/secure/zookeeper/server.log") from None
            time.sleep(0.5)


def main() -> None:
    global HOST
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--keyspace", default="scheduler")
    ap.add_argument("--host", default=HOST)
    ap.add_argument("command", choices=["wait-zk", "roles", "rotate-password"])
    ap.add_argument("role", nargs="?")
    args = ap.parse_args()
    folder = Path(args.dir)
    HOST = args.host
    if args.command == "wait-zk":
        wait_zk(folder)
    elif args.command == "roles":
        roles(folder, args.keyspace)
    else:
        rotate(folder, args.role or "")


if __name__ == "__main__":
    main()
