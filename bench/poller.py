"""Poller benchmarks against a single-node Cassandra, each next to its baseline in the
same run:

- ``poll_cost``: polling an empty current bucket (every shard) with 0 and with N future
  jobs stored. Goal: ratio <= 1.2.
- ``fire_throughput`` (bench/fire.py): one poller with a no-op handler draining M overdue
  jobs, next to a bare driver loop doing the same reads and writes, and one doing only
  the reads. Goal: >= 0.8 of the read-and-mark loop and >= 5,000 jobs/s.
- ``lateness``: p50/p99 of handler start minus due time at a steady rate (1,000 jobs/s)
  with a 1 s poll interval. Goal: p99 < 50 ms.
- ``async_handlers``: 20,000 overdue jobs, each handler awaiting ``asyncio.sleep(1)``, at
  concurrency 5,000; next to the same with sync handlers (``time.sleep(1)``) at
  concurrency 16, on fewer jobs (at 16 jobs/s, 20,000 would take 20 minutes). Goal:
  >= 4,000 jobs/s with the process's peak RSS under 300 MB.
- ``rss``: a ``scheduler run`` process's resident memory with the N-job backlog stored,
  next to the same with none. Goal: < 200 MB.

    .venv/bin/python -m bench.poller [--quick] [--backlog N] [--fire-jobs N] [--fire-rounds R]
        [--json] [--only NAME ...]

The backlog is written straight into ``jobs_by_bucket`` (the only table a poll reads),
spread over the next 30 days, with single-partition batches.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from cassandra.query import BatchStatement, BatchType

from bench.common import drop, fresh_store, machine, report
from bench.fire import SHARDS, fire_throughput, overdue_store
from scheduler import App, Client, Job, JobSpec
from scheduler.domain.clock import SystemClock
from scheduler.domain.keys import bucket_of_ms
from scheduler.poller import Poller, PollerConfig
from scheduler.store.cassandra.bind import bucket_params
from scheduler.store.cassandra.store import CassandraStore

__all__ = ["SHARDS", "async_handlers", "fire_throughput", "lateness", "load_backlog", "poll_cost", "rss"]


def load_backlog(store: CassandraStore, n: int, days: int = 30) -> float:
    """Write ``n`` far-future bucket rows; returns rows/s."""
    now = SystemClock().now_ms() + 3_600_000
    span = days * 86_400_000
    stmt = store.prepared("insert_bucket_row")
    t0 = time.perf_counter()
    per_batch = 20
    batches: list[tuple[Any, None]] = []
    for i in range(0, n, per_batch):
        # One batch = one (bucket, shard) partition: consecutive rows share bucket and shard.
        fire0 = now + (i * span) // n
        bucket = bucket_of_ms(fire0, 60)
        shard = (i // per_batch) % SHARDS
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for k in range(min(per_batch, n - i)):
            job = Job(job_id=f"bl-{i + k}", kind="backlog", data=b"{}", data_json=True,
                      due_ms=fire0 + k, fire_ms=fire0 + k, bucket=bucket, shard=shard)
            batch.add(stmt, (*bucket_params(job), store.job_ttl(job)))
        batches.append((batch, None))
        if len(batches) >= 2000:
            store._concurrent(batches, "backlog")
            batches = []
            print(f"  backlog {i + per_batch:>10,}/{n:,}", file=sys.stderr, end="\r")
    store._concurrent(batches, "backlog")
    print(file=sys.stderr)
    return n / (time.perf_counter() - t0)


def poll_cost(empty: CassandraStore, full: CassandraStore, rounds: int) -> dict[str, Any]:
    """Median time to read the current bucket of every shard (one poll)."""

    def one_poll(store: CassandraStore) -> float:
        now = SystemClock().now_ms()
        bucket = bucket_of_ms(now, 60)
        t0 = time.perf_counter()
        for shard in range(SHARDS):
            store.read_bucket(bucket, shard, None, now + 2000, 1000)
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {"empty": [], "full": []}
    for _ in range(rounds):  # alternate, so drift on a noisy machine hits both alike
        times["empty"].append(one_poll(empty))
        times["full"].append(one_poll(full))
    e, f = statistics.median(times["empty"]), statistics.median(times["full"])
    return {"poll_ms_empty_store": round(e * 1000, 2), "poll_ms_with_backlog": round(f * 1000, 2),
            "ratio": round(f / e, 3), "goal": "<= 1.2", "met": f / e <= 1.2}


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _sleepers(store: CassandraStore, n: int, now: int, concurrency: int, use_async: bool) -> dict[str, float]:
    """Fire ``n`` overdue jobs whose handlers sleep 1 s; jobs/s and the peak RSS."""
    async def nap(job: Job) -> None:
        await asyncio.sleep(1)

    def doze(job: Job) -> None:
        time.sleep(1)

    poller = Poller(store, App.for_function(nap if use_async else doze),
                    config=PollerConfig(concurrency=concurrency, read_limit=2000, max_buffered=50_000))
    for shard in range(SHARDS):
        poller.claim(shard, now)
    peak = _rss_mb()
    t0 = time.perf_counter()
    poller.start()
    while poller.stats.fired < n and time.perf_counter() - t0 < 600:
        time.sleep(0.05)
        peak = max(peak, _rss_mb())
    elapsed = time.perf_counter() - t0
    poller.stop()
    return {"jobs": n, "concurrency": concurrency, "jobs_per_s": round(n / elapsed),
            "seconds": round(elapsed, 1), "peak_rss_mb": round(peak, 1)}


def async_handlers(host: str, n: int = 20_000, concurrency: int = 5000, sync_n: int = 320) -> dict[str, Any]:
    now = SystemClock().now_ms()
    store = overdue_store(host, n, now)
    try:
        coro = _sleepers(store, n, now, concurrency, use_async=True)
    finally:
        drop(store)
        store.close()
    now = SystemClock().now_ms()
    store = overdue_store(host, sync_n, now)
    try:
        sync = _sleepers(store, sync_n, now, 16, use_async=False)
    finally:
        drop(store)
        store.close()
    met = coro["jobs_per_s"] >= 4000 and coro["peak_rss_mb"] < 300
    return {"async": coro, "sync": sync, "async_jobs_per_s": coro["jobs_per_s"],
            "sync_jobs_per_s": sync["jobs_per_s"], "ratio": round(coro["jobs_per_s"] / sync["jobs_per_s"], 1),
            "goal": ">= 4,000 jobs/s, RSS < 300 MB", "met": met}


def lateness(host: str, rate: int, seconds: int, samples_out: list[float] | None = None) -> dict[str, Any]:
    store = fresh_store(host, "bench_late", SHARDS)
    client = Client(store)
    # The window straddles a bucket boundary: the first jobs of a bucket are the ones a
    # poller can fire late (it cannot read a bucket before the previous one closed).
    earliest = datetime.now(UTC) + timedelta(seconds=client.meta.late_margin_ms / 1000 + 10 + seconds / 2)
    width = client.meta.bucket_width_s
    boundary = (int(earliest.timestamp()) // width + 1) * width
    start = datetime.fromtimestamp(boundary - seconds / 2, UTC)
    n = rate * seconds
    client.schedule_many([JobSpec(f"l{i}", start + timedelta(seconds=i / rate), "noop") for i in range(n)])
    samples: list[float] = []
    lock = threading.Lock()

    def handler(job: Job) -> None:
        late = time.time() * 1000 - job.due_ms
        with lock:
            samples.append(late)

    poller = Poller(store, App.for_function(handler), config=PollerConfig(poll_interval_s=1.0))
    poller.start(range(SHARDS))
    deadline = time.monotonic() + seconds + 60
    while len(samples) < n and time.monotonic() < deadline:
        time.sleep(0.2)
    poller.stop()
    drop(store)
    store.close()
    samples.sort()
    if samples_out is not None:
        samples_out.extend(samples)
    p50, p99 = samples[len(samples) // 2], samples[int(len(samples) * 0.99)]
    return {"jobs": n, "rate_per_s": rate, "fired": len(samples), "p50_ms": round(p50, 1),
            "p99_ms": round(p99, 1), "max_ms": round(samples[-1], 1), "goal": "p99 < 50 ms",
            "met": p99 < 50 and len(samples) == n}


def rss(url_empty: str, url_full: str, seconds: float) -> dict[str, Any]:
    def measure(url: str) -> float:
        env = {**os.environ, "SCHEDULER_STORE": url, "SCHEDULER_METRICS_ADDRESS": "127.0.0.1:0"}
        proc = subprocess.Popen([sys.executable, "-m", "scheduler", "run", "--handler", "bench.noop:handle"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        peak = 0.0
        end = time.monotonic() + seconds
        while time.monotonic() < end and proc.poll() is None:
            with open(f"/proc/{proc.pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        peak = max(peak, int(line.split()[1]) / 1024)
            time.sleep(0.5)
        proc.terminate()
        proc.wait(timeout=30)
        return peak

    empty, full = measure(url_empty), measure(url_full)
    return {"rss_mb_empty_store": round(empty, 1), "rss_mb_with_backlog": round(full, 1),
            "ratio": round(full / empty, 3), "goal": "< 200 MB", "met": full < 200}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes, a few minutes")
    ap.add_argument("--backlog", type=int, help="future jobs stored (default 10M, 1M quick)")
    ap.add_argument("--fire-jobs", type=int, help="overdue jobs to fire (default 100k, 30k quick)")
    ap.add_argument("--fire-rounds", type=int, default=5, help="fire_throughput's paired rounds (default 5)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--only", nargs="*", default=["poll_cost", "fire_throughput", "lateness", "rss"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    backlog = args.backlog or (1_000_000 if args.quick else 10_000_000)
    fire_n = args.fire_jobs or (30_000 if args.quick else 100_000)
    results: dict[str, Any] = {"machine": machine(), "quick": args.quick}
    steps: dict[str, Callable[[], Any]] = {}
    if {"poll_cost", "rss"} & set(args.only):
        empty = fresh_store(args.host, "bench_empty", SHARDS)
        full = fresh_store(args.host, "bench_backlog", SHARDS)
        rate = load_backlog(full, backlog)
        results["backlog"] = {"jobs": backlog, "load_rows_per_s": round(rate)}
        steps["poll_cost"] = lambda: poll_cost(empty, full, 200)
        steps["rss"] = lambda: rss(empty.url, full.url, 15 if args.quick else 30)
    steps["fire_throughput"] = lambda: fire_throughput(args.host, fire_n, args.fire_rounds)
    steps["lateness"] = lambda: lateness(args.host, 1000, 10 if args.quick else 30)
    steps["async_handlers"] = lambda: async_handlers(args.host)
    for name in args.only:
        print(f"running {name} ...", file=sys.stderr)
        results[name] = steps[name]()
        print(f"  {results[name]}", file=sys.stderr)
    if {"poll_cost", "rss"} & set(args.only):
        drop(empty)
        drop(full)
    report(results, args.json)


if __name__ == "__main__":
    main()
