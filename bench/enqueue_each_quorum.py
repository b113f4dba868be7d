"""``enqueue_each_quorum``: what a producer pays for ``each_quorum`` writes, on the two-DC
cluster: the throughput of ``Client.schedule_many`` at EACH_QUORUM divided by the same
at LOCAL_QUORUM (a producer in dc1, a keyspace replicated dc1:2,dc2:1), and the latency
of single ``schedule`` calls at each level.

Rounds alternate the two levels in one process, so both see the same machine; the
figure is the median of the per-pair ratios, with their spread. On one machine the
"remote" DC is a loopback address away, so the ratio shows the cost of waiting for one
more replica's answer, not of a WAN round trip (add the DCs' round-trip time to every
EACH_QUORUM write for that).

    ops/cassandra --nodes 3 --dcs 2 start
    .venv/bin/python -m bench.enqueue_each_quorum [--port 9042] [--jobs 4000] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.common import drop, machine, report
from scheduler import Client, JobSpec
from scheduler.domain.clock import SystemClock
from scheduler.store import SchemaOptions
from scheduler.store.cassandra.store import CassandraStore

HOSTS = "127.0.0.1,127.0.0.2,127.0.0.3"
LEVELS = ("local_quorum", "each_quorum")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


def enqueue_each_quorum(port: int, jobs: int = 4000, rounds: int = 5, singles: int = 300) -> dict[str, Any]:
    keyspace = f"bench_eq_{uuid.uuid4().hex[:8]}"
    url = f"cassandra://{HOSTS}:{port}/{keyspace}"
    store = CassandraStore(url)
    store.apply_schema(SchemaOptions(shard_count=8, replication="dc1:2,dc2:1"), SystemClock().now_ms())
    clients = {level: Client(url, dc="dc1", consistency=level) for level in LEVELS}
    at = datetime.now(UTC) + timedelta(hours=1)
    rates: dict[str, list[float]] = {level: [] for level in LEVELS}
    latency: dict[str, list[float]] = {level: [] for level in LEVELS}
    try:
        for level, client in clients.items():  # warm-up: connections, prepared statements
            client.schedule_many([JobSpec(f"w-{level}-{i}", at, "bench") for i in range(200)])
        for r in range(rounds):
            order = LEVELS if r % 2 == 0 else LEVELS[::-1]
            for level in order:
                specs = [JobSpec(f"{level}-{r}-{i}", at, "bench") for i in range(jobs)]
                t0 = time.perf_counter()
                clients[level].schedule_many(specs)
                rates[level].append(jobs / (time.perf_counter() - t0))
                for i in range(singles // rounds):
                    t1 = time.perf_counter()
                    clients[level].schedule(f"{level}-{r}-one-{i}", at, "bench")
                    latency[level].append(time.perf_counter() - t1)
        ratios = [e / q for q, e in zip(rates["local_quorum"], rates["each_quorum"], strict=True)]
        return {"value": round(statistics.median(ratios), 3), "unit": "x (EACH_QUORUM / LOCAL_QUORUM)",
                "spread": [round(min(ratios), 3), round(max(ratios), 3)],
                "details": {
                    "jobs_per_round": jobs, "rounds": rounds,
                    **{f"{level}_jobs_per_s": round(statistics.median(rates[level])) for level in LEVELS},
                    **{f"{level}_schedule_ms_p50": _pct(latency[level], 0.5) for level in LEVELS},
                    **{f"{level}_schedule_ms_p99": _pct(latency[level], 0.99) for level in LEVELS},
                    "single_calls_per_level": len(latency["local_quorum"]),
                    "replication": "dc1:2,dc2:1", "producer_dc": "dc1"}}
    finally:
        for client in clients.values():
            client.close()
        drop(store)
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--port", type=int, default=9042, help="the two-DC cluster's native port")
    ap.add_argument("--jobs", type=int, default=4000, help="jobs per schedule_many round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    print("running enqueue_each_quorum ...", file=sys.stderr)
    report({"enqueue_each_quorum": enqueue_each_quorum(args.port, args.jobs, args.rounds),
            "machine": machine()}, args.json)


if __name__ == "__main__":
    main()
