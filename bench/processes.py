"""``processes_scaling``: does ``scheduler run --processes 2`` drain a backlog faster than
``--processes 1`` on this machine? A poller firing fast handlers is CPU-bound in one
Python process (one interpreter lock), so a second process should raise throughput while
a core is free (on two cores, Cassandra takes its share of both).

Each round loads ``jobs`` no-op jobs (their bucket rows only, as ``fire_throughput``
does) due at one instant into a fresh keyspace of 16 shards, starts ``scheduler run
--processes N --handler bench.noop:note`` under a fresh ZooKeeper root, waits until every
shard is claimed, and takes the rate from the instant the jobs fall due to the last
start (the handler notes each start). Paired rounds, the order alternating; the figure is the median of the
per-round ratios (2 processes over 1), with their spread. Goal: > 1.

    .venv/bin/python -m bench.processes [--jobs 40000] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import drop, fresh_store, machine, report, write_bucket_rows
from bench.fleet import records, start, stop_all, wait_claimed
from scheduler.domain.clock import SystemClock
from scheduler.domain.keys import bucket_of_ms, shard_of
from scheduler.domain.model import Job

SHARDS = 16


def drain(host: str, zk: str, processes: int, jobs: int, tmp: Path) -> float:
    """Jobs per second of ``scheduler run --processes N`` draining ``jobs`` due at once."""
    now = SystemClock().now_ms()
    store = fresh_store(host, "bench_procs", SHARDS, now_ms=now - 120_000)
    out = tmp / f"procs-{processes}-{time.time_ns()}.log"
    root = f"zookeeper://{zk}/bench-procs-{time.time_ns()}"
    proc = start(store.url, root, out, "--processes", str(processes), handler="bench.noop:note",
                 session_timeout_s=None, metrics="off")
    try:
        width = store.meta().bucket_width_s
        due = now + 20_000 + jobs // 10  # loading at about 10 rows per ms or better
        rows = [Job(job_id=f"p{i:07d}", kind="bench", data=b"{}", data_json=True, due_ms=due, fire_ms=due,
                    bucket=bucket_of_ms(due, width), shard=shard_of(f"p{i:07d}", SHARDS))
                for i in range(jobs)]
        write_bucket_rows(store, rows)
        wait_claimed(store, SHARDS, processes)
        if SystemClock().now_ms() > due - 2000:
            raise SystemExit("loading and claiming took too long: pass fewer --jobs")
        deadline = time.monotonic() + 600
        while len(records(out)) < jobs and time.monotonic() < deadline:
            time.sleep(0.2)
        fired = sorted(r[2] for r in records(out))
        if len(fired) < jobs:
            raise SystemExit(f"only {len(fired)} of {jobs} jobs fired within 10 minutes")
        # From the instant every job fell due to the last start: the whole drain. (The
        # middle of the starts alone reads bursts: a poller starts what it has buffered
        # far faster than it drains, and two processes' bursts overlap.)
        return len(fired) / max(0.001, (fired[-1] - due) / 1000)
    finally:
        stop_all([proc])
        drop(store)
        store.close()


def processes_scaling(host: str, zk: str, jobs: int = 40_000, rounds: int = 3) -> dict[str, Any]:
    pairs: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-procs-") as tmp:
        for i in range(rounds):
            order = (1, 2) if i % 2 == 0 else (2, 1)
            rate = {n: drain(host, zk, n, jobs, Path(tmp)) for n in order}
            pairs.append((rate[1], rate[2]))
            print(f"  round {i + 1}/{rounds}: 1 process {rate[1]:,.0f} jobs/s, 2 processes "
                  f"{rate[2]:,.0f} jobs/s", file=sys.stderr)
    ratios = [two / one for one, two in pairs]
    ratio = statistics.median(ratios)
    return {"jobs": jobs, "rounds": rounds, "shards": SHARDS, "handler": "no-op (notes its start)",
            "one_process_jobs_per_s": round(statistics.median(p[0] for p in pairs)),
            "two_processes_jobs_per_s": round(statistics.median(p[1] for p in pairs)),
            "ratio": round(ratio, 3), "ratio_is": "median of per-round ratios, 2 processes over 1",
            "per_round": [{"one": round(a), "two": round(b), "ratio": round(b / a, 3)} for a, b in pairs],
            "goal": "> 1", "met": ratio > 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--zk", default="127.0.0.1:2181")
    ap.add_argument("--jobs", type=int, default=40_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report({"machine": machine(), "processes_scaling": processes_scaling(args.host, args.zk, args.jobs,
                                                                         args.rounds)}, args.json)


if __name__ == "__main__":
    main()
