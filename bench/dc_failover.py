"""``dc_failover``: seconds from killing every poller of a shard's home DC until its
shards fire again in the other DC, on the two-DC cluster.

Two pollers of dc1 and one of dc2 form one fleet under the home rule dc1=1,dc2=1 (a
keyspace replicated dc1:2,dc2:1, session timeout 4 s); jobs are due at a steady rate on
every shard. Both dc1 pollers are killed with -9; the figure is the time until every
shard whose home is dc1 has fired a job again (the dc2 poller's), with the time to the
first such firing beside it. Goal: <= the fail-over delay + 10 s (the dead pollers'
sessions expire, the delay runs, the dc2 poller claims each shard at SERIAL and reads
it). Cassandra's nodes all stay up: only the pollers go.

    ops/cassandra --nodes 3 --dcs 2 start
    .venv/bin/python -m bench.dc_failover [--port 9042] [--zk 127.0.0.1:2181] [--delay 5] [--json]

``ops/bench`` runs against the single node, so this one is run by hand (see
docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import drop, machine, report
from bench.fleet import records, start, stop_all, wait_claimed
from scheduler import Client, JobSpec
from scheduler.domain.clock import SystemClock
from scheduler.domain.home import homes
from scheduler.domain.keys import shard_of
from scheduler.fleet.view import write_home_rule
from scheduler.store import SchemaOptions
from scheduler.store.cassandra.store import CassandraStore

HOSTS = "127.0.0.1,127.0.0.2,127.0.0.3"
WEIGHTS = {"dc1": 1, "dc2": 1}
SESSION_S = 4  # bench.fleet.start's
RATE = 50  # jobs due per second, over every shard


def first_firings(path: Path, shards: set[int], count: int, since_ms: int) -> dict[int, int]:
    """{shard: the first firing (ms) at or after ``since_ms``} for ``shards`` (out of
    ``count``). The killed pollers write nothing after the kill: every such firing is
    the other DC's."""
    first: dict[int, int] = {}
    for job_id, _, fired in records(path):
        shard = shard_of(job_id, count)
        if fired >= since_ms and shard in shards and fired < first.get(shard, 2**62):
            first[shard] = fired
    return first


def dc_failover(port: int, zk_hosts: str, tmp: Path, delay_s: float = 5.0,
                shards: int = 8) -> dict[str, Any]:
    keyspace = f"bench_dcf_{uuid.uuid4().hex[:8]}"
    url = f"cassandra://{HOSTS}:{port}/{keyspace}"
    store = CassandraStore(url)
    t0 = time.monotonic()
    store.apply_schema(SchemaOptions(shard_count=shards, replication="dc1:2,dc2:1"), SystemClock().now_ms())
    schema_s = round(time.monotonic() - t0, 1)
    home_dc1 = {s for s, dc in homes(range(shards), WEIGHTS).items() if dc == "dc1"}
    root = f"/bench-dc-failover-{time.time_ns()}"
    zk = f"zookeeper://{zk_hosts}{root}"
    write_home_rule(zk, WEIGHTS)
    out = tmp / "dc-failover.log"
    common = ("--dc-failover-delay", f"{delay_s:g}s")
    procs = [start(url, zk, out, "--dc", dc, "--name", name, *common)
             for name, dc in (("a1", "dc1"), ("a2", "dc1"), ("b1", "dc2"))]
    client = Client(url, dc="dc1")
    try:
        wait_claimed(store, shards, 3)
        # Jobs due from 2 s on, through the kill, the sessions' expiry and the delay, and
        # 20 s past the goal.
        seconds = 3 + SESSION_S + delay_s + 30
        begin = datetime.now(UTC) + timedelta(seconds=2)
        client.schedule_many([JobSpec(f"d{i}", begin + timedelta(seconds=i / RATE), "bench")
                              for i in range(int(RATE * seconds))])
        # Three seconds of firing in both DCs before the kill.
        time.sleep(max(0.0, begin.timestamp() - time.time()) + 3)
        assert all(p.poll() is None for p in procs), "a poller exited before the kill"
        killed_ms = time.time_ns() // 1_000_000
        for p in procs[:2]:
            p.kill()
            p.wait()
        deadline = time.monotonic() + delay_s + 90
        first: dict[int, int] = {}
        while time.monotonic() < deadline:
            first = first_firings(out, home_dc1, shards, killed_ms)
            if set(first) == home_dc1:
                break
            time.sleep(0.2)
        taken = {r.shard for r in store.checkpoints() if r.owner == "b1"}
        every_s = round((max(first.values()) - killed_ms) / 1000, 2) if set(first) == home_dc1 else None
        goal = delay_s + 10
        return {"value": every_s, "unit": "s",
                "first_firing_s": round((min(first.values()) - killed_ms) / 1000, 2) if first else None,
                "goal": f"<= failover delay + 10 s ({goal:g} s)",
                "met": every_s is not None and every_s <= goal,
                "details": {"failover_delay_s": delay_s, "session_timeout_s": SESSION_S,
                            "shards": shards, "dc1_home_shards": len(home_dc1),
                            "dc1_shards_owned_by_dc2": len(taken & home_dc1),
                            "jobs_due_per_s": RATE, "schema_apply_s": schema_s}}
    finally:
        stop_all(procs)
        client.close()
        drop(store)
        store.close()
        _drop_root(zk_hosts, root)


def _drop_root(zk_hosts: str, root: str) -> None:
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=zk_hosts)
    with contextlib.suppress(Exception):
        zk.start(timeout=10)
        zk.delete(root, recursive=True)
    with contextlib.suppress(Exception):
        zk.stop()
        zk.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--port", type=int, default=9042, help="the cluster's native port")
    ap.add_argument("--zk", default="127.0.0.1:2181")
    ap.add_argument("--delay", type=float, default=5.0, help="--dc-failover-delay, seconds")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results: dict[str, Any] = {"machine": machine()}
    with tempfile.TemporaryDirectory() as tmp:
        print("running dc_failover ...", file=sys.stderr)
        results["dc_failover"] = dc_failover(args.port, args.zk, Path(tmp), args.delay)
        print(f"  {results['dc_failover']}", file=sys.stderr)
    report(results, args.json)


if __name__ == "__main__":
    main()
