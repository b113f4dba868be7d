"""``scheduler api`` as a real process on the embedded store, over a socket: the CLI's
error contract (bad input is one ``error:`` line and exit 1, naming the tokens file and
its line but never a token), the port the system chose, plain HTTP and HTTPS with a
certificate made by openssl here, a body over the limit refused before it is all sent,
and SIGTERM as the normal stop (exit 0). No token ever reaches the process's output."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.apihelp import TOKENS, tokens_file
from tests.conftest import require_tool
from tests.procs import ROOT, wait_until
from tests.unit.test_cli import run

SECRET = "a-token-nobody-may-ever-see-0123"


def one_error_line(res: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.stderr and not res.stdout.strip()
    return lines[0]


def run_api(store: str, tokens: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env["SCHEDULER_STORE"] = store
    if tokens is not None:
        env["SCHEDULER_API_TOKENS_FILE"] = str(tokens)
    return subprocess.run([sys.executable, "-m", "scheduler", "api", *args], capture_output=True, text=True,
                          env=env, timeout=60, cwd=ROOT)


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/api.db"
    assert run("schema", "apply", store=url).returncode == 0
    return url


@pytest.mark.parametrize("lines, says", [
    (f"admin {SECRET}\nwriter {SECRET}x\n", "line 2: the first word must be a role"),
    (f"{SECRET} admin\n", "line 1: the first word must be a role"),
    (f"# tokens\n\nproducer {SECRET} extra\n", "line 3: expected two words"),
    (f"admin {SECRET}\nreader {SECRET}\n", "line 2: the same token as line 1"),
    ("reader short-token\n", "line 1: the token is shorter than 16 characters"),
    (f"reader {SECRET}é\n", "line 1: the token holds a character that is not printable ASCII"),
    (SECRET + "\n", "line 1: expected two words"),
    ("# nothing but a comment\n\n", "holds no token"),
])
def test_a_bad_tokens_file_is_one_line_naming_the_file_and_line_but_never_a_token(
        store: str, tmp_path: Path, lines: str, says: str):
    bad = tmp_path / "tokens"
    bad.write_text(lines, encoding="utf-8")
    res = run_api(store, bad, "--address", "127.0.0.1:0")
    assert res.returncode == 1, res.stderr
    line = one_error_line(res)
    assert str(bad) in line and says in line, line
    assert SECRET not in res.stderr + res.stdout and "short-token" not in res.stderr


def test_a_tokens_file_unset_unreadable_or_not_utf8_is_one_line(store: str, tmp_path: Path):
    assert "set SCHEDULER_API_TOKENS_FILE" in one_error_line(run_api(store, None))
    missing = run_api(store, tmp_path / "nope")
    assert "cannot read" in one_error_line(missing) and "nope" in missing.stderr
    latin = tmp_path / "latin1"
    latin.write_bytes(b"admin " + SECRET.encode() + b"\nreader caf\xe9-caf\xe9-caf\xe9-caf\xe9\n")
    res = run_api(store, latin)
    assert "line 2: not UTF-8 text" in one_error_line(res) and "caf" not in res.stderr


@pytest.mark.parametrize("args, says", [
    (["--address", "127.0.0.1:99999"], "--address"),
    (["--address", "nosuch.invalid:9480"], "cannot resolve"),
    (["--tls-cert", "/nonexistent.pem"], "--tls-cert and --tls-key go together"),
    (["--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"], "cannot serve TLS"),
])
def test_a_bad_address_or_tls_pair_is_one_line(store: str, tmp_path: Path, args: list[str], says: str):
    res = run_api(store, tokens_file(tmp_path), *args)
    assert res.returncode == 1 and says in one_error_line(res)


def test_a_missing_store_is_refused_and_not_created(tmp_path: Path):
    res = run_api(f"sqlite:///{tmp_path}/missing.db", tokens_file(tmp_path), "--address", "127.0.0.1:0")
    assert res.returncode == 1 and "missing.db" in one_error_line(res)
    assert not (tmp_path / "missing.db").exists()


class Served:
    """A running ``scheduler api``: its port, and requests to it with a role's token."""

    def __init__(self, port: int, tls: ssl.SSLContext | None) -> None:
        self.port, self.tls = port, tls

    def connect(self) -> http.client.HTTPConnection:
        if self.tls is not None:
            return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10, context=self.tls)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)

    def call(self, role: str | None, method: str, path: str, body: Any = None) -> tuple[int, Any, Any]:
        conn = self.connect()
        try:
            headers = {"content-type": "application/json"}
            if role:
                headers["authorization"] = f"Bearer {TOKENS[role]}"
            conn.request(method, path, None if body is None else json.dumps(body), headers)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, json.loads(data) if data.startswith((b"{", b"[")) else data, resp
        finally:
            conn.close()


@contextlib.contextmanager
def serve(store: str, tmp_path: Path, *extra: str, tls: ssl.SSLContext | None = None) -> Iterator[Served]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env["SCHEDULER_API_TOKENS_FILE"] = str(tokens_file(tmp_path))
    log = tmp_path / "api.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "scheduler", "api", "--store", store,
                                 "--address", "127.0.0.1:0", *extra],
                                cwd=ROOT, stdout=out, stderr=out, env=env)
    try:
        wait_until(lambda: "api:" in log.read_text() or proc.poll() is not None, 30, "the start line")
        found = re.search(r"https?://127\.0\.0\.1:(\d+)/", log.read_text())
        assert found and proc.poll() is None, log.read_text()
        served = Served(int(found.group(1)), tls)
        wait_until(lambda: _answers(served), 30, "the API to answer")
        yield served
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    text = log.read_text()
    assert proc.returncode == 0, text  # SIGTERM is the normal stop
    assert "Traceback" not in text
    assert not [t for t in TOKENS.values() if t in text], "a token reached the log"


def _answers(served: Served) -> bool:
    try:
        return served.call(None, "GET", "/healthz")[0] == 200
    except OSError:
        return False


@pytest.fixture
def api(store: str, tmp_path: Path) -> Iterator[Served]:
    with serve(store, tmp_path) as served:
        yield served


def test_the_process_serves_the_api_over_a_socket(api: Served):
    job = {"id": "tenant/7%20x", "at": "2030-01-01T09:00:00Z", "kind": "email", "payload": {"a": 1}}
    status, created, _ = api.call("producer", "POST", "/v1/jobs", job)
    assert status == 201 and created["job_id"] == "tenant/7%20x", created
    status, got, _ = api.call("reader", "GET", "/v1/jobs/" + quote("tenant/7%20x", safe=""))
    assert status == 200 and got == created
    status, again, _ = api.call("producer", "POST", "/v1/jobs", job)
    assert status == 201 and again == created
    status, conflict, _ = api.call("producer", "POST", "/v1/jobs", {**job, "kind": "sms"})
    assert status == 409 and set(conflict) == {"error"}
    status, _, resp = api.call(None, "GET", "/v1/jobs/x")
    assert status == 401 and resp.getheader("www-authenticate").startswith("Bearer")
    assert api.call("reader", "DELETE", "/v1/jobs/x")[0] == 403
    assert api.call(None, "GET", "/readyz")[1] == {"status": "ready"}
    status, doc, _ = api.call(None, "GET", "/openapi.json")
    assert status == 200 and "/v1/jobs/batch" in doc["paths"]
    status, text, _ = api.call(None, "GET", "/metrics")
    assert status == 200
    assert b'scheduler_api_requests_total{code="201",method="POST",route="/v1/jobs"} 2.0' in text


def test_a_body_over_the_limit_is_413_chunked_or_told_by_its_length(api: Served):
    with socket.create_connection(("127.0.0.1", api.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
                     b"Authorization: Bearer " + TOKENS["producer"].encode() + b"\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
        try:
            for _ in range(64):  # 4 MiB offered; how little is read: tests/unit/test_api_parts.py
                sock.sendall(chunk)
        except OSError:
            pass  # the server answered and closed: it read no more
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    # Told by a Content-Length over the limit: refused before any of it.
    with socket.create_connection(("127.0.0.1", api.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/jobs/batch HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5000000\r\n"
                     b"Authorization: Bearer " + TOKENS["producer"].encode() + b"\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 413")


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    openssl = require_tool("openssl", "openssl")
    tmp = tmp_path_factory.mktemp("tls")
    cert, key = tmp / "api.crt", tmp / "api.key"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-days", "2", "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=30)
    return cert, key


def test_with_tls_it_serves_https_only(store: str, tmp_path: Path, pem: tuple[Path, Path]):
    context = ssl.create_default_context(cafile=str(pem[0]))
    with serve(store, tmp_path, "--tls-cert", str(pem[0]), "--tls-key", str(pem[1]), tls=context) as api:
        job = {"id": "tls1", "at": "2030-01-01T09:00:00Z", "kind": "email"}
        assert api.call("producer", "POST", "/v1/jobs", job)[0] == 201
        assert api.call("reader", "GET", "/v1/jobs/tls1")[1]["job_id"] == "tls1"
        assert "https://127.0.0.1" in (tmp_path / "api.log").read_text()
        plain = Served(api.port, None)  # plain HTTP to the TLS port gets no answer of the API
        try:
            status = plain.call("reader", "GET", "/v1/jobs/tls1")[0]
        except (OSError, http.client.HTTPException):
            status = None
        assert status != 200
