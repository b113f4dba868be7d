"""``scheduler console`` keeps the CLI's error contract: bad input is one ``error:`` line on
stderr and exit 1 (never a traceback, never uvicorn's exit 3, which means a lost
ZooKeeper session here), nothing is created, and ``--address HOST:0`` says which port
the system chose. Real processes on the embedded store."""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import ROOT, wait_until
from tests.unit.test_cli import run


def one_error_line(res: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.stderr and not res.stdout.strip()
    return lines[0]


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/console.db"
    assert run("schema", "apply", store=url).returncode == 0
    return url


@pytest.mark.parametrize("address", [
    "127.0.0.1:99999", "127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1", ":9470", "127.0.0.1:http",
    "127.0.0.1:\u0669\u0664\u0667\u0660", "[::1]:"])  # the last but one: Arabic-Indic digits
def test_a_malformed_address_is_one_line_and_exit_1(tmp_path: Path, address: str):
    url = f"sqlite:///{tmp_path}/never.db"
    res = run("console", "--address", address, store=url)
    assert res.returncode == 1, res.stderr
    assert "--address" in one_error_line(res)
    assert not (tmp_path / "never.db").exists()


def test_an_address_in_use_is_one_line_and_exit_1(store: str):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = run("console", "--address", f"127.0.0.1:{port}", store=store)
    assert res.returncode == 1, res.stderr
    assert one_error_line(res) == (f"error: address 127.0.0.1:{port} is in use "
                                   "(choose another with --address)")


@pytest.mark.parametrize("address, says", [("nosuch.invalid:9470", "cannot resolve"),
                                           ("192.0.2.1:9470", "cannot listen on 192.0.2.1:9470")])
def test_an_address_not_of_this_machine_is_one_line_and_exit_1(store: str, address: str, says: str):
    res = run("console", "--address", address, store=store)
    assert res.returncode == 1 and says in one_error_line(res)


def test_a_missing_store_is_refused_and_not_created(tmp_path: Path):
    url = f"sqlite:///{tmp_path}/missing.db"
    res = run("console", "--address", "127.0.0.1:0", store=url)
    assert res.returncode == 1 and "missing.db" in one_error_line(res)
    assert not list(tmp_path.iterdir()), "the console created a file"


def test_port_0_prints_the_port_the_system_chose_and_sigterm_stops_it_with_0(store: str, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    log = tmp_path / "console.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "scheduler", "console", "--store", store,
                                 "--address", "127.0.0.1:0"], cwd=ROOT, stdout=out, stderr=out, env=env)
    try:
        wait_until(lambda: "console:" in log.read_text() or proc.poll() is not None, 30, "the start line")
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", log.read_text())
        assert found, log.read_text()
        port = int(found.group(1))
        assert port != 0
        statuses: list[int] = []

        def answers() -> bool:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                conn.request("GET", "/fleet")
                statuses.append(conn.getresponse().status)
            except OSError:
                return False
            finally:
                conn.close()
            return True

        wait_until(answers, 30, "the console to answer on the printed port")
        assert statuses == [200]
        # Bound to loopback: a name that is not (DNS rebinding) is refused.
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", "/fleet", headers={"Host": f"rebound.example:{port}"})
            assert conn.getresponse().status == 400
        finally:
            conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0, log.read_text()  # SIGTERM is the normal stop
    assert "Traceback" not in log.read_text()
