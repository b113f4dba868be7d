"""The same three nodes as two data centres (``ops/cassandra --nodes 3 --dcs 2``): a
keyspace replicated ``dc1:2,dc2:1``, jobs scheduled by a client of dc2 (one at
LOCAL_QUORUM, one at EACH_QUORUM) and fired by a poller of dc1, each talking only to its
own DC's nodes. No ZooKeeper: the poller owns every shard (``--shards``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from scheduler import Client, JobSpec
from scheduler.errors import ConfigError
from tests.cluster.conftest import cluster_ops
from tests.handlers import read_records
from tests.procs import ROOT, start_poller, stop_all, wait_until

pytestmark = [pytest.mark.cluster3, pytest.mark.dcs2]


def scheduler_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scheduler", *args, "--store", url], cwd=ROOT, text=True,
                          capture_output=True, timeout=180, check=False,
                          env={**os.environ, "SCHEDULER_DC": "", "SCHEDULER_STORE": ""})


def hosts_used(client: Client) -> set[str]:
    """The nodes the client's session holds connections to."""
    return {h.address for h in client.store.session.get_pool_state()}  # type: ignore[attr-defined]


def test_status_shows_each_nodes_dc(cluster_2dc):
    out = cluster_ops("status", dcs=2)
    rows = re.findall(r"^node(\d) (\S+) dc (\S+) up pid \d+$", out, re.M)
    assert [(n, dc) for n, _, dc in rows] == [("1", "dc1"), ("2", "dc1"), ("3", "dc2")], out


@pytest.mark.timeout(300)
def test_scheduled_in_dc2_fired_by_a_poller_of_dc1(cluster_2dc, cluster_2dc_keyspace, tmp_path: Path):
    url = f"cassandra://{cluster_2dc}/{cluster_2dc_keyspace}"
    done = scheduler_cli(url, "schema", "apply", "--replication", "dc1:2,dc2:1", "--shards", "4",
                         "--bucket-width", "10")
    assert done.returncode == 0, done.stderr

    with Client(url, dc="dc2") as client, Client(url, dc="dc2", consistency="each_quorum") as strict:
        row = client.store.session.execute(  # type: ignore[attr-defined]
            "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = %s",
            (cluster_2dc_keyspace,)).one()
        replication = dict(row[0])
        assert replication.pop("class").endswith("NetworkTopologyStrategy")
        assert replication == {"dc1": "2", "dc2": "1"}

        start = datetime.now(UTC) + timedelta(seconds=3)
        jobs = client.schedule_many([JobSpec(f"local-{i}", start + timedelta(milliseconds=50 * i), "record")
                                     for i in range(20)])
        jobs += strict.schedule_many([JobSpec(f"each-{i}", start + timedelta(milliseconds=50 * i), "record")
                                      for i in range(20)])
        # Routing stays in dc2: the only node these clients ever opened a pool to.
        assert hosts_used(client) == hosts_used(strict) == {"127.0.0.3"}

    out = tmp_path / "fired.log"
    poller = start_poller(url, out, "--dc", "dc1", "--shards", "0-3", "--poll-interval", "0.2")
    try:
        def all_fired() -> bool:
            assert poller.poll() is None, Path(f"{out}.log").read_text()[-2000:]
            return {r.job_id for r in read_records(str(out))} >= {j.job_id for j in jobs}

        wait_until(all_fired, 90, "every job fired by the dc1 poller")
    finally:
        stop_all([poller])
    assert poller.returncode == 0, Path(f"{out}.log").read_text()[-2000:]
    fired = read_records(str(out))
    assert len(fired) == len(jobs) and all(r.fired_ms >= r.due_ms for r in fired)


def test_a_dc_the_cluster_lacks_is_one_line(cluster_2dc, cluster_2dc_keyspace):
    url = f"cassandra://{cluster_2dc}/{cluster_2dc_keyspace}"
    with pytest.raises(ConfigError, match=r"no node in DC 'dc3' \(its DCs: dc1, dc2\)"):
        Client(url, dc="dc3")
    # A replication naming a DC the cluster lacks is refused by Cassandra, nothing created.
    done = scheduler_cli(url, "schema", "apply", "--replication", "dc1:2,dc9:1")
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "dc9" in done.stderr, done.stderr
