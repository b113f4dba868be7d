"""No secret of the secured stack is ever printed, and each process is given only its
own role's secrets. Self-contained: the test runs every command and process whose output
it checks (the ops script, the CLI, a poller, the exporter and the console, all reading
their secrets from files), and greps all of it, plus the command lines and environments
of the processes while they run, for every password, digest credential, key and token."""

from __future__ import annotations

import http.client
import os
import re
import secrets as rand
import stat
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from scheduler.domain.clock import SystemClock
from scheduler.security import Secret
from scheduler.settings import cassandra_security, zookeeper_security
from scheduler.store import SchemaOptions
from tests.handlers import read_records
from tests.procs import ROOT, free_port, start_poller, stop_all, wait_until
from tests.secure import (
    SECURE_DIR,
    ZK_PORT,
    create_keyspace,
    role_dir,
    role_env,
    secret_files,
    secrets,
    url_for,
)

# The secured stack is shared: these tests rotate its passwords and replace (even expire)
# its certificate, so ops/test runs them one at a time, not beside other tests.
pytestmark = pytest.mark.serial

OPS = ROOT / "ops" / "secure-stack"


class Outputs:
    """Every text a run printed or served, by where it came from."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}

    def add(self, name: str, text: str) -> None:
        self.texts[f"{len(self.texts)}:{name}"] = text

    def run(self, name: str, cmd: list[str], env: dict[str, str] | None = None,
            timeout: float = 180) -> subprocess.CompletedProcess[str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
        res = subprocess.run(cmd, env={**base, **(env or {})}, cwd=ROOT, capture_output=True, text=True,
                             timeout=timeout)
        self.add(f"{name} (stdout)", res.stdout)
        self.add(f"{name} (stderr)", res.stderr)
        return res

    def cli(self, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(f"scheduler {' '.join(args)}", [sys.executable, "-m", "scheduler", *args], env)

    def leaks(self, secret_values: list[str]) -> list[str]:
        """Where a secret shows (its first 4 characters, never the whole of it)."""
        return [f"{s[:4]}... in {name}" for name, text in self.texts.items()
                for s in secret_values if s in text]


def shown(text: str) -> str:
    """``text`` for a failure message: each secret replaced (a failing test prints no
    secret either)."""
    for secret in secrets():
        text = text.replace(secret, "<secret>")
    return text


@pytest.fixture
def ks(secure_keyspace: str) -> str:
    create_keyspace(secure_keyspace, SchemaOptions(shard_count=4, bucket_width_s=10), SystemClock().now_ms())
    return secure_keyspace


def test_the_reader_folder_holds_no_admin_or_server_secret(secure_stack):
    """The running stack's folders: every secret 0600 in folders at 0700, and the
    reader's settings (the exporter's) point into the reader's folder only, which holds
    none of the admin's or the servers' secrets."""
    assert stat.S_IMODE(SECURE_DIR.stat().st_mode) == 0o700
    for top in ("ca", "server", "roles"):
        for path in [SECURE_DIR / top, *(SECURE_DIR / top).rglob("*")]:
            assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path
    reader = role_dir("reader")
    env = role_env("reader")
    paths = [v for k, v in env.items() if k.endswith(("_FILE", "_CA", "_CERT", "_KEY"))]
    assert len(paths) == 6 and all(Path(p).parent == reader for p in paths), env
    assert {p.name for p in reader.iterdir()} == {"ca.pem", "cassandra.pw", "client.crt", "client.key",
                                                  "zk.auth"}
    held = "\n".join(p.read_text() for p in reader.iterdir())
    others = {name: path for name, path in secret_files().items() if not name.startswith("reader:")}
    assert {"admin:cassandra.pw", "server:keystore.pw", "server:server.p12", "ca:ca.pw"} <= set(others)
    # (Names only in the messages: a failing assertion must not print a secret either.)
    held_by_reader = [name for name, path in others.items()
                      if path.suffix in (".pw", ".auth") and path.read_text().strip() in held]
    assert not held_by_reader, f"the reader's folder holds {held_by_reader}"


def test_the_grep_finds_a_printed_secret(secure_stack):
    """The check below can fail: a command that prints a password, or part of a key, is
    caught by the same capture and grep."""
    app = role_env("app")
    out = Outputs()
    out.run("cat", ["sh", "-c", 'echo "connecting with $(cat "$SCHEDULER_CASSANDRA_PASSWORD_FILE")"'], app)
    out.cli(app, "--help")
    found = out.leaks(secrets())
    assert [leak for leak in found if "in 0:cat (stdout)" in leak], found
    key = Outputs()
    part_of_key = "import os; print(open(os.environ['SCHEDULER_ZK_KEY']).read()[300:500])"
    key.run("key", [sys.executable, "-c", part_of_key], app)
    found = key.leaks(secrets())
    assert found, "a printed part of a key went unnoticed"


@pytest.fixture
def running() -> Iterator[list[subprocess.Popen[Any]]]:
    procs: list[subprocess.Popen[Any]] = []
    yield procs
    stop_all(procs)


def request(port: int, method: str, path: str, body: dict[str, str] | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, str]:
    """One request to 127.0.0.1:``port``: the status, and the headers and body as one text."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        data = urllib.parse.urlencode(body).encode() if body is not None else None
        form = {"Content-Type": "application/x-www-form-urlencoded"} if data else {}
        conn.request(method, path, body=data, headers={**form, **(headers or {})})
        resp = conn.getresponse()
        head = "\n".join(f"{k}: {v}" for k, v in resp.getheaders())
        return resp.status, head + "\n\n" + resp.read().decode()
    finally:
        conn.close()


def answers(port: int, path: str, needle: str = "") -> bool:
    try:
        status, text = request(port, "GET", path)
    except OSError:
        return False
    return status == 200 and needle in text


def spawn(log: Path, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    """``scheduler ARGS`` with only ``env``'s settings, its output into ``log``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    with open(log, "wb") as fh:
        return subprocess.Popen([sys.executable, "-m", "scheduler", *args], cwd=ROOT, env={**base, **env},
                                stdout=fh, stderr=subprocess.STDOUT)


def run_ops(out: Outputs) -> None:
    """The ops script, which makes and handles every secret; a rotation included (the
    new password is read afterwards, with every other secret)."""
    for args in (["status"], ["env", "--role", "admin"], ["env", "--role", "app"],
                 ["env", "--role", "reader"], ["rotate-password", "reader"], ["start"]):
        res = out.run(f"ops/secure-stack {' '.join(args)}", [str(OPS), *args])
        assert res.returncode == 0, shown(res.stderr)


def run_cli(out: Outputs, app: dict[str, str], reader: dict[str, str], wrong: Path) -> None:
    """The CLI as app and reader, a refused login and a missing permission among them;
    schedules j1 (due in 2 s, kind record) for the poller."""
    at = (datetime.now(UTC) + timedelta(seconds=2)).isoformat()
    for env, args in ((app, ["schedule", "--id", "j1", "--at", at, "--kind", "record", "--json"]),
                      (app, ["schedule", "--id", "j2", "--at", "2030-01-01T00:00:00Z", "--kind", "k"]),
                      (app, ["get", "j1"]), (app, ["lag", "--json"]), (reader, ["status", "--json"]),
                      (reader, ["dead", "list"]), (app, ["cancel", "j2"])):
        res = out.cli(env, *args)
        assert res.returncode == 0, (args, shown(res.stderr))
    assert out.cli({**app, "SCHEDULER_CASSANDRA_PASSWORD_FILE": str(wrong)}, "get", "j1").returncode == 1
    assert out.cli(reader, "cancel", "j1").returncode == 1


def use_console(out: Outputs, port: int, token: str) -> None:
    """Sign in with the token, read the pages with the session, cancel with the token."""
    status, text = request(port, "POST", "/login", {"who": "tester", "token": token})
    out.add("console sign-in", text)
    assert status == 303, shown(text)
    cookie = re.search(r"set-cookie: ([^;]+)", text, flags=re.I).group(1)  # type: ignore[union-attr]
    for path in ("/fleet", "/jobs?id=j1", "/dead", "/audit"):
        status, text = request(port, "GET", path, headers={"Cookie": cookie})
        out.add(f"console {path}", text)
        assert status == 200, (path, shown(text[-500:]))
    status, text = request(port, "POST", "/jobs/cancel", {"job_id": "j1"},
                           {"Authorization": f"Bearer {token}"})
    out.add("console cancel (bearer)", text)
    assert status in (200, 303), shown(text)


def snapshot_running(out: Outputs, procs: list[subprocess.Popen[Any]]) -> None:
    """Every process's command line (ps) and each of ours' environment, taken while all
    of ours run (checked before and after, and their pids are in the listing)."""
    assert [p.poll() for p in procs] == [None] * len(procs), "a process exited early"
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    environs = {p.pid: Path(f"/proc/{p.pid}/environ").read_bytes().decode(errors="replace") for p in procs}
    assert [p.poll() for p in procs] == [None] * len(procs), "a process exited during the snapshot"
    listed = {int(line.split(None, 1)[0]) for line in ps.splitlines()[1:]}
    assert {p.pid for p in procs} <= listed, "the snapshot misses a running process"
    out.add("ps", ps)
    for pid, environ in environs.items():
        out.add(f"environment of pid {pid}", environ)


def test_no_secret_appears_in_any_output(ks, tmp_path, running):
    out = Outputs()
    run_ops(out)
    coordinator = f"zookeeper://localhost:{ZK_PORT}/{ks}"
    app = {**role_env("app"), "SCHEDULER_STORE": url_for("app", ks), "SCHEDULER_COORDINATOR": coordinator}
    reader = {**role_env("reader"), "SCHEDULER_STORE": url_for("reader", ks),
              "SCHEDULER_COORDINATOR": coordinator}
    token_file, wrong = tmp_path / "console.token", tmp_path / "wrong.pw"
    for f in (token_file, wrong):
        f.write_text(rand.token_hex(24) + "\n")
        f.chmod(0o600)
    token = token_file.read_text().strip()
    # Long-running processes, each reading its secrets from the files its settings name.
    fired = tmp_path / "fired.log"
    running.append(start_poller(app["SCHEDULER_STORE"], fired, env={**os.environ, **app}))
    running.append(spawn(tmp_path / "exporter.log", reader, "exporter", "--address", "127.0.0.1:0",
                         "--interval", "1"))
    port = free_port()
    running.append(spawn(tmp_path / "console.log", {**app, "SCHEDULER_CONSOLE_TOKEN_FILE": str(token_file)},
                         "console", "--address", f"127.0.0.1:{port}", "--allow-actions"))
    run_cli(out, app, reader, wrong)
    # Each process at work: the poller fires, the exporter serves lag, the console acts.
    wait_until(lambda: "j1" in {r.job_id for r in read_records(str(fired))}, 60, "the poller firing j1")
    log = tmp_path / "exporter.log"
    served = r"on http://[\d.]+:(\d+)/metrics"
    wait_until(lambda: re.search(served, log.read_text()) is not None, 60, "the exporter")
    exporter = int(re.search(served, log.read_text()).group(1))  # type: ignore[union-attr]
    wait_until(lambda: answers(exporter, "/metrics", "scheduler_shard_lag_seconds"), 30, "the exporter's lag")
    out.add("exporter /metrics", request(exporter, "GET", "/metrics")[1])
    wait_until(lambda: answers(port, "/fleet"), 60, "the console")
    use_console(out, port, token)
    snapshot_running(out, running)
    # Their logs once stopped, and the settings' reprs.
    for p in running:
        p.terminate()
        p.wait(timeout=30)
    for f in tmp_path.glob("*.log"):
        out.add(f.name, f.read_text())
    sec = cassandra_security(app)
    out.add("reprs", "\n".join([repr(sec), str(sec), repr(Secret(path=str(wrong))),
                                repr(zookeeper_security(app)), repr(sec.auth_provider("app"))]))
    checked = [*secrets(), token, wrong.read_text().strip()]
    assert len(checked) > 20  # every role's password and keys, the servers', the CA's, the token
    leaked = out.leaks(checked)  # (where, and 4 characters of each: never the secret itself)
    assert not leaked, leaked
