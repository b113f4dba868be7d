"""The 3-node Cassandra cluster (``ops/cassandra --nodes 3 start``: 127.0.0.1-3:9042).

``ops/test`` runs these tests in a second phase, after stopping the single node (both
layouts listen on 127.0.0.1:9042): first those of the one-DC layout, then (marker
``dcs2``) those of the same three nodes as two DCs (``--dcs 2``: dc1 = nodes 1 and 2,
dc2 = node 3). A missing cluster, or one of the other layout, skips locally and fails
in CI.

Environment (beside a cluster on other ports, as ops/cassandra reads them):
CASSANDRA_PORT (the native port, 9042; also passed to ops/cassandra as
CASSANDRA_NATIVE_PORT unless that is set), CASSANDRA_JMX_PORT and CASSANDRA_CLUSTER_DIR
(read by ops/cassandra itself).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import CASSANDRA_PORT, CI, require_server
from tests.procs import ROOT

NODES = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
HOSTS = ",".join(NODES) + f":{CASSANDRA_PORT}"
OPS = ROOT / "ops" / "cassandra"
# The DC of each node in each layout, as the snitch reports it.
TWO_DCS = {"127.0.0.1": "dc1", "127.0.0.2": "dc1", "127.0.0.3": "dc2"}
ONE_DC = dict.fromkeys(NODES, "datacenter1")


def ops_run(*args: str, dcs: int = 1, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {"CASSANDRA_NATIVE_PORT": str(CASSANDRA_PORT), **os.environ}
    return subprocess.run([str(OPS), "--nodes", "3", "--dcs", str(dcs), *args], capture_output=True,
                          text=True, timeout=timeout, check=False, env=env)


def cluster_ops(*args: str, dcs: int = 1, timeout: float = 240) -> str:
    done = ops_run(*args, dcs=dcs, timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def nodes_up(dcs: int = 1) -> set[str]:
    """Addresses that node 1 (or node 2 while node 1 is down) sees Up and Normal."""
    for n in ("1", "2"):
        done = ops_run("nodetool", "--node", n, "status", dcs=dcs, timeout=60)
        if done.returncode == 0:
            return set(re.findall(r"^UN\s+(\S+)", done.stdout, re.M))
    return set()


def wait_all_up(timeout: float = 120, dcs: int = 1) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if nodes_up(dcs) >= set(NODES):
            return time.monotonic() - t0
        time.sleep(1)
    raise AssertionError(f"the cluster did not show 3 nodes up within {timeout} s")


def node_dcs() -> dict[str, str]:
    """Each node's DC as the cluster reports it (the driver reads system.local and
    system.peers)."""
    from cassandra.cluster import Cluster

    cl = Cluster(list(NODES), port=CASSANDRA_PORT, protocol_version=5)
    try:
        cl.connect()
        return {h.address: h.datacenter for h in cl.metadata.all_hosts()}
    finally:
        cl.shutdown()


def wait_all_known(timeout: float = 60) -> dict[str, str]:
    """``node_dcs()`` once it names all three nodes, or as it stands after ``timeout``.

    Gossip (what nodetool shows) runs ahead of ``system.peers`` (what the driver reads):
    a node just seen Up and Normal can still be missing from its peers' tables for a
    moment, so a single read can name two nodes of a healthy cluster."""
    deadline = time.monotonic() + timeout
    while True:
        found = node_dcs()
        if set(found) >= set(NODES) or time.monotonic() >= deadline:
            return found
        time.sleep(1)


def require_layout(dcs: int) -> str:
    """The cluster's hosts once all three nodes are up, settled, and in the ``dcs`` layout;
    skips (fails in CI) otherwise."""
    start = f"ops/cassandra --nodes 3{' --dcs 2' if dcs == 2 else ''} start"
    for host in NODES:
        require_server(f"Cassandra node {host}", host, CASSANDRA_PORT, start)
    # An open native port on each node is not yet a settled ring: wait until node 1
    # sees all three Up and Normal before the first test writes a schema.
    wait_all_up(dcs=dcs)
    found = wait_all_known()
    if found != (TWO_DCS if dcs == 2 else ONE_DC):
        msg = f"the running cluster's DCs are {found}, not the layout these tests need; run {start}"
        if CI:
            pytest.fail(msg + " (CI=true: a missing layout fails the run)")
        pytest.skip(msg)
    return HOSTS


@pytest.fixture(scope="session")
def cluster() -> str:
    """The one-DC layout (its fault tests kill nodes of dc1 under LOCAL_QUORUM: see
    docs/two-data-centres.md for why they cannot run on the two-DC one)."""
    return require_layout(1)


@pytest.fixture(scope="session")
def cluster_2dc() -> str:
    """The two-DC layout: ``ops/cassandra --nodes 3 --dcs 2 start``. A cut left by a
    partition test that was killed is healed first (``tests/partition.py``)."""
    from tests.partition import heal

    if os.geteuid() == 0:
        heal()
    return require_layout(2)


def _keyspace(hosts: str, dcs: int) -> Iterator[str]:
    # A fault test before this one may have left a node restarting: a schema change
    # needs every node up, so no test starts on a ring still settling.
    wait_all_up(240, dcs=dcs)
    name = "c_" + uuid.uuid4().hex[:12]
    yield name
    from scheduler.store.cassandra.store import CassandraStore

    # Best effort: a node may still be catching up after a fault test.
    with contextlib.suppress(Exception):
        admin = CassandraStore(f"cassandra://{hosts}/{name}")
        try:
            admin.session.execute(f"DROP KEYSPACE IF EXISTS {name}")
        finally:
            admin.close()


@pytest.fixture
def cluster_keyspace(cluster: str) -> Iterator[str]:
    yield from _keyspace(cluster, 1)


@pytest.fixture
def cluster_2dc_keyspace(cluster_2dc: str) -> Iterator[str]:
    yield from _keyspace(cluster_2dc, 2)
