"""The ops/ scripts: idempotent start, cached fetch, clear error on a held port."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

# These start the 3-node ZooKeeper ensemble on its fixed ports (127.0.0.1:2191-2193), as the
# fleet's leader test does: ops/test runs them one at a time.
pytestmark = pytest.mark.serial

OPS = Path(__file__).parents[2] / "ops"


def ops(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(OPS / args[0]), *args[1:]], capture_output=True, text=True, timeout=300)


def test_start_when_running_does_nothing(cassandra_available, zookeeper_available):
    for script in ("cassandra", "zookeeper"):
        res = ops(script, "start")
        assert res.returncode == 0, res.stderr
        assert "already running" in res.stderr and "started pid" not in res.stderr
        assert ops(script, "status").returncode == 0


def test_second_fetch_is_cached(cassandra_available):
    res = ops("cassandra", "fetch")
    assert res.returncode == 0 and "fetching" not in res.stderr


def test_port_held_by_another_process_is_a_clear_error(zookeeper_available):
    # The 3-node ensemble's first client port, held by a plain socket.
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 2191))
        sock.listen()
        res = ops("zookeeper", "--nodes", "3", "start")
    assert res.returncode != 0
    assert "port 127.0.0.1:2191 is held by another process" in res.stderr
    ops("zookeeper", "--nodes", "3", "stop")


def test_bad_arguments(cassandra_available):
    res = ops("cassandra", "--nodes", "2", "start")
    assert res.returncode != 0 and "--nodes must be 1 or 3" in res.stderr
