"""``scheduler console --tls-cert --tls-key``: the console serves HTTPS with the given
certificate, its session cookie is ``Secure``, plain HTTP gets no page, and a bad pair
of files is refused with one line before anything starts. Embedded store; a real
uvicorn process and a real TLS handshake (the certificate made by openssl here)."""

from __future__ import annotations

import http.client
import os
import ssl
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require_tool
from tests.procs import ROOT, free_port, wait_until
from tests.unit.test_cli import run

TOKEN = "tls-test-console-token-012345"


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    openssl = require_tool("openssl", "openssl")
    tmp = tmp_path_factory.mktemp("tls")
    cert, key = tmp / "console.crt", tmp / "console.key"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-days", "2", "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=30)
    return cert, key


@pytest.fixture
def console(pem: tuple[Path, Path], tmp_path: Path) -> Iterator[int]:
    store = f"sqlite:///{tmp_path}/tls.db"
    assert run("schema", "apply", store=store).returncode == 0
    port = free_port()
    log = tmp_path / "console.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "console", "--store", store, "--allow-actions",
             "--address", f"127.0.0.1:{port}", "--tls-cert", str(pem[0]), "--tls-key", str(pem[1])],
            cwd=ROOT, stdout=out, stderr=out, env={**env, "SCHEDULER_CONSOLE_TOKEN": TOKEN})
    try:
        wait_until(lambda: _answers(port) or proc.poll() is not None, 30, "the console to listen")
        assert proc.poll() is None, log.read_text()[-2000:]
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    text = log.read_text()
    assert "https://127.0.0.1" in text and TOKEN not in text


def _answers(port: int) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # only: is it up?
    try:
        _https(port, "GET", "/login", ctx)
    except OSError:
        return False
    return True


def _https(port: int, method: str, path: str, ctx: ssl.SSLContext,
           body: dict[str, str] | None = None) -> http.client.HTTPResponse:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    data = urllib.parse.urlencode(body) if body else None
    headers = {"Content-Type": "application/x-www-form-urlencoded"} if body else {}
    conn.request(method, path, body=data, headers=headers)
    return conn.getresponse()


def test_the_console_serves_https_with_a_secure_cookie(pem, console):
    ctx = ssl.create_default_context(cafile=str(pem[0]))  # verifies the name and the chain
    page = _https(console, "GET", "/fleet", ctx)
    assert page.status == 200 and b"Lag per shard" in page.read()
    signed_in = _https(console, "POST", "/login", ctx, {"who": "alice", "token": TOKEN})
    assert signed_in.status == 303
    cookie = signed_in.getheader("Set-Cookie") or ""
    assert "scheduler_console=" in cookie and "Secure" in cookie and "HttpOnly" in cookie, cookie
    plain = http.client.HTTPConnection("127.0.0.1", console, timeout=10)
    with pytest.raises((http.client.HTTPException, OSError)):
        plain.request("GET", "/fleet")
        plain.getresponse().read()


def test_bad_tls_options_are_refused_with_one_line(pem, tmp_path):
    store = f"sqlite:///{tmp_path}/refused.db"
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate\n")
    for args, says in [
        (["--tls-cert", str(pem[0])], "--tls-cert and --tls-key go together"),
        (["--tls-cert", str(not_pem), "--tls-key", str(pem[1])], "cannot serve TLS"),
        (["--tls-cert", str(pem[0]), "--tls-key", str(tmp_path / "missing.key")], "cannot serve TLS"),
    ]:
        res = run("console", *args, store=store)
        lines = [line for line in res.stderr.splitlines() if line.strip()]
        assert res.returncode != 0 and len(lines) == 1 and says in lines[0], res.stderr
    assert not Path(f"{tmp_path}/refused.db").exists(), "a refused start writes nothing"


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("localhost", True), ("[::1]", True),
    ("0.0.0.0", False), ("10.1.2.3", False), ("console.internal", False),
])
def test_only_loopback_addresses_count_as_private(host, loopback):
    from scheduler.security import is_loopback

    assert is_loopback(host) is loopback
