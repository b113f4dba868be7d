"""The secured stack (ops/secure-stack): each error a user meets is one line naming the
cause and the setting, a fleet fires over ZooKeeper TLS as the app role while its
password is rotated and the servers' certificate renewed, and the exporter runs as
reader. (That no secret is printed: test_secret_output.py, which runs what it checks.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from scheduler import Client
from scheduler.domain.clock import SystemClock
from scheduler.errors import TlsError
from scheduler.fleet.view import read_fleet
from scheduler.fleet.zkconn import kazoo_client
from scheduler.observe.lag import lag_report
from scheduler.settings import zookeeper_credentials, zookeeper_security
from scheduler.store import SchemaOptions
from tests.handlers import read_records
from tests.procs import ROOT, schedule, start_poller, stop_all, wait_until
from tests.secure import CQL_PORT, ZK_PORT, create_keyspace, open_as, role_env, url_for

# The secured stack is shared: these tests rotate its passwords and replace (even expire)
# its certificate, so ops/test runs them one at a time, not beside other tests.
pytestmark = pytest.mark.serial

OPS = ROOT / "ops" / "secure-stack"


def cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    res = subprocess.run([sys.executable, "-m", "scheduler", *args], env={**base, **env}, cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout)
    return res


@pytest.fixture
def ks(secure_keyspace: str) -> str:
    create_keyspace(secure_keyspace, SchemaOptions(shard_count=8, bucket_width_s=10), SystemClock().now_ms())
    return secure_keyspace


def one_line_error(res: subprocess.CompletedProcess[str], *phrases: str) -> str:
    assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in res.stderr, res.stderr
    for phrase in phrases:
        assert phrase in errors[0], (phrase, errors[0])
    return errors[0]


def test_each_error_a_user_meets_is_one_line_with_the_cause_and_the_setting(ks, tmp_path):
    app, reader = role_env("app"), role_env("reader")
    app["SCHEDULER_STORE"] = url_for("app", ks)
    reader["SCHEDULER_STORE"] = url_for("reader", ks)
    wrong = tmp_path / "wrong.pw"
    wrong.write_text("not-the-password\n")
    cases: list[tuple[str, dict[str, str], tuple[str, ...], tuple[str, ...]]] = [
        ("wrong password", {**app, "SCHEDULER_CASSANDRA_PASSWORD_FILE": str(wrong)}, ("get", "x"),
         ("refused the login of user 'app'", "SCHEDULER_CASSANDRA_PASSWORD_FILE")),
        ("unknown user", {**app, "SCHEDULER_STORE": url_for("mallory", ks)}, ("get", "x"),
         ("refused the login of user 'mallory'",)),
        ("no login", {**app, "SCHEDULER_STORE": f"cassandra://localhost:{CQL_PORT}/{ks}",
                      "SCHEDULER_CASSANDRA_PASSWORD_FILE": ""}, ("get", "x"), ("requires a login",)),
        ("plaintext to the TLS port", {**app, "SCHEDULER_CASSANDRA_CA": ""}, ("get", "x"),
         ("requires TLS", "SCHEDULER_CASSANDRA_CA")),
        ("TLS to the plaintext port", {**app, "SCHEDULER_STORE": f"cassandra://app@127.0.0.1:9042/{ks}"},
         ("get", "x"), ("does not speak TLS on that port",)),
        ("untrusted certificate", {**app, "SCHEDULER_CASSANDRA_CA": "/etc/ssl/certs/ca-certificates.crt"},
         ("get", "x"), ("is not trusted", "SCHEDULER_CASSANDRA_CA")),
        ("hostname mismatch", {**app, "SCHEDULER_STORE": f"cassandra://app@127.0.0.5:{CQL_PORT}/{ks}"},
         ("get", "x"), ("not valid for that address", "SCHEDULER_CASSANDRA_VERIFY_HOSTNAME")),
        ("missing permission", reader, ("cancel", "x"),
         ("lacks the MODIFY permission", "as the app role")),
        ("password in the URL", {**app, "SCHEDULER_STORE": f"cassandra://app:hunter2hunter2@localhost/{ks}"},
         ("get", "x"), ("holds a password", "SCHEDULER_CASSANDRA_PASSWORD_FILE")),
    ]
    assert cli(app, "schedule", "--id", "x", "--at", "2030-01-01T00:00:00Z", "--kind", "k").returncode == 0
    seen = {}
    for name, env, args, phrases in cases:
        seen[name] = one_line_error(cli(env, *args), *phrases)
    assert "hunter2" not in seen["password in the URL"]
    # The ZooKeeper side: a missing client certificate (kazoo says only "time-out").
    zk = {**app, "SCHEDULER_ZK_CERT": "", "SCHEDULER_ZK_KEY": ""}
    seen["ZooKeeper without a client certificate"] = one_line_error(
        cli(zk, "status"), "requires a client certificate", "SCHEDULER_ZK_CERT")
    # Turning hostname verification off works, and says so.
    res = cli({**app, "SCHEDULER_STORE": f"cassandra://app@127.0.0.5:{CQL_PORT}/{ks}",
               "SCHEDULER_CASSANDRA_VERIFY_HOSTNAME": "false"}, "lag", "--json")
    assert res.returncode == 0 and "hostname verification is off" in res.stderr, res.stderr
    print("\n".join(f"{k}: {v}" for k, v in seen.items()))


def test_zookeeper_tls_errors_from_the_library(secure_stack):
    env = role_env("app")
    sec = zookeeper_security(env)
    creds = zookeeper_credentials(env)
    plain = zookeeper_security({})
    with pytest.raises(TlsError, match="speaks only TLS"):
        read_fleet(f"zookeeper://localhost:{ZK_PORT}/x", timeout_s=3, security=lambda: plain,
                   credentials=lambda: None)
    with pytest.raises(TlsError, match="does not speak TLS"):
        read_fleet("zookeeper://127.0.0.1:2181/x", timeout_s=3, security=lambda: sec,
                   credentials=lambda: None)
    untrusted = zookeeper_security({**env, "SCHEDULER_ZK_CA": "/etc/ssl/certs/ca-certificates.crt"})
    with pytest.raises(TlsError, match="not trusted"):
        read_fleet(f"zookeeper://localhost:{ZK_PORT}/x", timeout_s=3, security=lambda: untrusted,
                   credentials=lambda: creds)
    assert read_fleet(f"zookeeper://localhost:{ZK_PORT}/x", timeout_s=5, security=lambda: sec,
                      credentials=lambda: creds) is not None


def test_an_expired_certificate_is_named_and_a_renewed_one_is_taken_without_a_restart(ks):
    app = {**role_env("app"), "SCHEDULER_STORE": url_for("app", ks)}
    store = open_as("app", ks)  # a connection made before: it keeps working throughout
    try:
        subprocess.run([str(OPS), "expire-cert"], check=True, capture_output=True, timeout=120)
        one_line_error(cli(app, "get", "x"), "has expired", "renew")
    finally:
        subprocess.run([str(OPS), "renew-cert"], check=True, capture_output=True, timeout=120)
    assert cli(app, "lag", "--json").returncode == 0
    assert store.meta().bucket_width_s == 10
    store.close()


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return {name: float(value) for name, value in
            (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))}


def test_a_fleet_over_tls_fires_through_password_and_certificate_rotations_the_reader_reads_lag(ks, tmp_path):
    app = {**role_env("app"), "SCHEDULER_STORE": url_for("app", ks)}
    app["SCHEDULER_COORDINATOR"] = f"zookeeper://localhost:{ZK_PORT}/{ks}"
    reader = {**role_env("reader"), "SCHEDULER_STORE": url_for("reader", ks),
              "SCHEDULER_COORDINATOR": app["SCHEDULER_COORDINATOR"]}
    base = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    out = tmp_path / "fired.log"
    procs: list[subprocess.Popen[Any]] = []
    store = open_as("app", ks)
    client = Client(store)
    try:
        due = schedule(client, 150, 8, lead_s=5, prefix="a")
        procs += [start_poller(url_for("app", ks), out, "--session-timeout", "6", env={**base, **app})
                  for _ in range(2)]
        old_pw = Path(app["SCHEDULER_CASSANDRA_PASSWORD_FILE"]).read_text().strip()
        subprocess.run([str(OPS), "rotate-password", "app"], check=True, capture_output=True, timeout=120)
        # A process started now reads the new password, and so does a new connection of
        # this one; the old password is refused.
        due |= schedule_cli(app, 3, "b")
        fresh = open_as("app", ks)
        try:
            due |= schedule(Client(fresh), 50, 3, lead_s=4, prefix="c")
        finally:
            fresh.close()
        stale = tmp_path / "old.pw"
        stale.write_text(old_pw)
        one_line_error(cli({**app, "SCHEDULER_CASSANDRA_PASSWORD_FILE": str(stale)}, "get", "x"),
                       "refused the login")
        with open(tmp_path / "exporter.log", "wb") as fh:
            args = ["exporter", "--address", "127.0.0.1:0", "--interval", "1"]
            exporter = subprocess.Popen([sys.executable, "-m", "scheduler", *args], cwd=ROOT,
                                        env={**base, **reader}, stdout=subprocess.DEVNULL, stderr=fh)
        procs.append(exporter)
        # The servers' certificates renewed under the running fleet: both serve the new
        # one to new connections, and new processes connect through it.
        before = {port: served_cert(port) for port in (CQL_PORT, ZK_PORT)}
        subprocess.run([str(OPS), "renew-cert"], check=True, capture_output=True, timeout=120)
        wait_until(lambda: all(served_cert(p) != cert for p, cert in before.items()), 30,
                   "both servers serving the renewed certificate")
        due |= schedule_cli(app, 3, "d")
        wait_until(lambda: len(fleet_as(reader)["pollers"] or []) == 2, 30, "the reader seeing the fleet")
        reader_cannot_write(reader, ks)
        try:
            wait_until(lambda: set(due) <= {r.job_id for r in read_records(str(out))}, 90, "every job fired")
        except AssertionError:
            missing = sorted(set(due) - {r.job_id for r in read_records(str(out))})
            log_tail = Path(f"{out}.log").read_text()[-6000:]
            raise AssertionError(f"{len(missing)} not fired: {missing[:20]}; exits "
                                 f"{[p.poll() for p in procs]}\n{log_tail}") from None
        records = read_records(str(out))
        assert not [r for r in records if r.fired_ms < r.due_ms], "fired early"
        assert len({r.pid for r in records}) == 2, "both members fired"
        log = (tmp_path / "exporter.log")
        wait_until(lambda: re.search(r"on (http://\S+/metrics)", log.read_text()) is not None, 60, "exporter")
        url = re.search(r"on (http://\S+/metrics)", log.read_text()).group(1)  # type: ignore[union-attr]
        time.sleep(2)
        exported = scrape(url)
        admin = open_as("admin", ks)
        try:
                truth = {row.shard: row for row in lag_report(admin, SystemClock().now_ms())}
        finally:
            admin.close()
        for shard, row in truth.items():
            lag = exported[f'scheduler_shard_lag_seconds{{shard="{shard}"}}']
            # Read a moment apart, and a 10 s bucket may close in between (lag then drops by
            # up to a bucket): the exporter's older figure may be up to a bucket higher.
            assert -5 < lag - row.lag_s < 10 + 5, (shard, lag, row.lag_s)
    finally:
        stop_all(procs)
        client.close()
        store.close()


def served_cert(port: int) -> bytes:
    """The certificate a server on localhost:``port`` serves to a new connection."""
    import socket

    tls = zookeeper_security(role_env("app")).tls
    assert tls is not None
    with socket.create_connection(("localhost", port), timeout=5) as raw, \
            tls.context().wrap_socket(raw, server_hostname="localhost") as conn:
        return conn.getpeercert(binary_form=True) or b""


def fleet_as(env: dict[str, str]) -> dict[str, Any]:
    res = cli(env, "status", "--json")
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))


def reader_cannot_write(reader: dict[str, str], ks: str) -> None:
    """The reader's ZooKeeper identity reads the fleet's znodes and may not add to them."""
    from kazoo.exceptions import NoAuthError

    zk = kazoo_client(f"localhost:{ZK_PORT}", 10, zookeeper_credentials(reader), zookeeper_security(reader))
    zk.start(timeout=10)
    try:
        assert len(zk.get_children(f"/{ks}/members")) == 2
        with pytest.raises(NoAuthError):
            zk.create(f"/{ks}/members/intruder", b"", ephemeral=True)
    finally:
        zk.stop()
        zk.close()


def schedule_cli(env: dict[str, str], n: int, prefix: str) -> dict[str, int]:
    """``n`` jobs through the CLI (a new process: it reads the password file now)."""
    from datetime import UTC, datetime, timedelta

    due: dict[str, int] = {}
    for i in range(n):
        at = datetime.now(UTC) + timedelta(seconds=4 + i * 0.05)
        res = cli(env, "schedule", "--id", f"{prefix}{i}", "--at", at.isoformat(), "--kind", "record",
                  "--json")
        assert res.returncode == 0, res.stderr
        due[f"{prefix}{i}"] = int(at.timestamp() * 1000)
    return due


def test_a_reader_added_later_gets_read_access_when_a_poller_starts(secure_stack, tmp_path):
    """znodes made before SCHEDULER_ZK_READERS named the reader: the reader's view says what
    to do, and the next poller to start gives the reader its read access."""
    from scheduler.errors import PermissionDenied
    from scheduler.fleet.coord import ZooKeeperCoordinator

    app, reader = role_env("app"), role_env("reader")
    root = f"/late_{os.getpid()}"
    hosts = f"localhost:{ZK_PORT}"
    old = ZooKeeperCoordinator(hosts, root, credentials=zookeeper_credentials(app),
                               security=zookeeper_security({**app, "SCHEDULER_ZK_READERS": ""}))
    old.start("old-member")
    try:
        view = {**reader, "SCHEDULER_COORDINATOR": f"zookeeper://{hosts}{root}"}
        with pytest.raises(PermissionDenied, match="SCHEDULER_ZK_READERS"):
            read_fleet(view["SCHEDULER_COORDINATOR"], credentials=lambda: zookeeper_credentials(view),
                       security=lambda: zookeeper_security(view))
        new = ZooKeeperCoordinator(hosts, root, credentials=zookeeper_credentials(app),
                                   security=zookeeper_security(app))
        new.start("new-member")
        try:
            fleet = read_fleet(view["SCHEDULER_COORDINATOR"], credentials=lambda: zookeeper_credentials(view),
                               security=lambda: zookeeper_security(view))
            assert fleet is not None and set(fleet.members or []) == {"old-member", "new-member"}
        finally:
            new.stop()
    finally:
        old.stop()

