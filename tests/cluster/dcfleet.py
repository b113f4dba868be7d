"""The fleet the two-DC fault tests share: a keyspace replicated dc1:2,dc2:1 with 8
shards of 10 s buckets under the home rule dc1=1,dc2=1, pollers a1 and a2 in dc1 and b1
in dc2 (a 4 s session, a 5 s fail-over delay), and a producer in each DC."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from scheduler import Client
from scheduler.domain.clock import SystemClock
from scheduler.domain.home import homes
from scheduler.fleet import dcs as dcrec
from scheduler.fleet.view import write_home_rule
from scheduler.store import SchemaOptions, open_store
from tests.conftest import ZOOKEEPER_HOSTS
from tests.faultload import Pollers, Producer, preload
from tests.handlers import read_records
from tests.procs import wait_until

SHARDS = 8
WEIGHTS = {"dc1": 1, "dc2": 1}
SESSION_S = 4  # ZooKeeper's smallest (2 ticks of 2 s): a dead poller's node goes soonest
FAILOVER_S = 5
CONCURRENCY = 16


def outages(root: str) -> list[dict[str, Any]]:
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=ZOOKEEPER_HOSTS)
    zk.start(timeout=10)
    try:
        return dcrec.read_outages(zk, root)
    finally:
        zk.stop()
        zk.close()


class DcFleet:
    """Set up with ``start``; always ``close`` (stops producers and pollers, closes the
    clients; returns the pollers' exit codes)."""

    def __init__(self, hosts: str, keyspace: str, zk_root: str, tmp: Path, *poller_args: str) -> None:
        self.url = f"cassandra://{hosts}/{keyspace}"
        self.zk_root = zk_root
        # dc1's view: its reads never go to dc2's node, which some tests stop.
        self.admin = open_store(self.url, dc="dc1")
        options = SchemaOptions(shard_count=SHARDS, bucket_width_s=10, replication="dc1:2,dc2:1")
        self.admin.apply_schema(options, SystemClock().now_ms())
        self.home = homes(range(SHARDS), WEIGHTS)
        self.shards = {dc: {s for s, h in self.home.items() if h == dc} for dc in WEIGHTS}
        zk = f"zookeeper://{ZOOKEEPER_HOSTS}{zk_root}"
        write_home_rule(zk, WEIGHTS)
        self.out = tmp / "fired.log"
        self.pollers = Pollers(self.url, self.out, "--coordinator", zk, "--session-timeout", str(SESSION_S),
                               "--dc-failover-delay", f"{FAILOVER_S}s", "--concurrency", str(CONCURRENCY),
                               *poller_args)
        self.clients = {"dc1": Client(self.url, dc="dc1"), "dc2": Client(self.url, dc="dc2")}
        self.producers = [Producer(self.clients["dc1"], prefix="live1-"),
                          Producer(self.clients["dc2"], prefix="live2-")]
        self.due: dict[str, int] = {}
        self.pids: dict[str, int] = {}

    def owners(self) -> dict[int, str | None]:
        assert self.pollers.running(), "a poller exited"
        return {c.shard: c.owner for c in self.admin.checkpoints()}

    def split_by_home(self) -> bool:
        now = self.owners()
        dc2 = self.shards["dc2"]
        return len(now) == SHARDS and all((now[s] == "b1") == (s in dc2) for s in range(SHARDS))

    def start(self, preload_s: float) -> None:
        """Start a1, a2 and b1; once each shard is with its home DC, preload jobs due over
        ``preload_s`` in each DC, start the producers, and wait for all three firing."""
        for name, dc in (("a1", "dc1"), ("a2", "dc1"), ("b1", "dc2")):
            self.pids[name] = self.pollers.start(extra=("--dc", dc, "--name", name))[0].pid
        wait_until(self.split_by_home, 90, "each shard owned by a poller of its home DC")
        self.due.update(preload(self.clients["dc1"], 300, preload_s, lead_s=2, prefix="pre1-"))
        self.due.update(preload(self.clients["dc2"], 150, preload_s, lead_s=2, prefix="pre2-"))
        for p in self.producers:
            p.start()

        def all_firing() -> bool:
            fired = Counter(r.pid for r in read_records(str(self.out)))
            return min(fired[pid] for pid in self.pids.values()) >= 10

        wait_until(all_firing, 60, "all three pollers firing")

    def stop_producers(self) -> None:
        for p in self.producers:
            p.stop()
            self.due.update(p.acked)

    def close(self) -> list[int | None]:
        for p in self.producers:
            p.stop()
        codes = self.pollers.stop()
        for c in self.clients.values():
            c.close()
        self.admin.close()
        return codes

    def producer_errors(self) -> int:
        return sum(len(p.errors) for p in self.producers)
