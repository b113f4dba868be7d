"""The 3-node Cassandra cluster (``ops/cassandra --nodes 3 start``: 127.0.0.1-3:9042).

``ops/test`` runs these tests in a second phase, after stopping the single node (both
layouts listen on 127.0.0.1:9042). A missing cluster skips locally and fails in CI.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import require_server
from tests.procs import ROOT

NODES = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
HOSTS = ",".join(NODES)
OPS = ROOT / "ops" / "cassandra"


def cluster_ops(*args: str, timeout: float = 240) -> str:
    done = subprocess.run([str(OPS), "--nodes", "3", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def nodes_up() -> set[str]:
    """Addresses that node 1 (or node 2 while node 1 is down) sees Up and Normal."""
    for n in ("1", "2"):
        done = subprocess.run([str(OPS), "--nodes", "3", "nodetool", "--node", n, "status"],
                              capture_output=True, text=True, timeout=60, check=False)
        if done.returncode == 0:
            return set(re.findall(r"^UN\s+(\S+)", done.stdout, re.M))
    return set()


def wait_all_up(timeout: float = 120) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if nodes_up() >= set(NODES):
            return time.monotonic() - t0
        time.sleep(1)
    raise AssertionError(f"the cluster did not show 3 nodes up within {timeout} s")


@pytest.fixture(scope="session")
def cluster() -> str:
    for host in NODES:
        require_server(f"Cassandra node {host}", host, 9042, "ops/cassandra --nodes 3 start")
    # An open native port on each node is not yet a settled ring: wait until node 1
    # sees all three Up and Normal before the first test writes a schema.
    wait_all_up()
    return HOSTS


@pytest.fixture
def cluster_keyspace(cluster: str) -> Iterator[str]:
    # A fault test before this one may have left a node restarting: a schema change
    # needs every node up, so no test starts on a ring still settling.
    wait_all_up(240)
    name = "c_" + uuid.uuid4().hex[:12]
    yield name
    from scheduler.store.cassandra.store import CassandraStore

    # Best effort: a node may still be catching up after a fault test.
    with contextlib.suppress(Exception):
        admin = CassandraStore(f"cassandra://{cluster}/{name}")
        try:
            admin.session.execute(f"DROP KEYSPACE IF EXISTS {name}")
        finally:
            admin.close()
