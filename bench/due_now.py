"""``lateness_due_now``: jobs scheduled due *now* at a steady rate by a producer process,
fired by one poller (16 shards, in this process), with the due-now fast path (the producer nudges the
owner) against the same run without it (the baseline: such jobs fire at now + late
margin). Lateness is the handler's start less the job's due time, which is when the
``schedule`` call was made.

    .venv/bin/python -m bench.due_now [--rate 1000] [--seconds 30] [--host 127.0.0.1] [--json]

Goal (issue 19): p99 within 500 ms at 1,000 jobs/s.
"""

from __future__ import annotations

import argparse
import multiprocessing
import threading
import time
from datetime import UTC, datetime
from typing import Any

from bench.common import drop, fresh_store, machine, report
from scheduler import App, Client, Job, JobSpec
from scheduler.poller import Poller, PollerConfig
from scheduler.settings import Settings
from scheduler.store.cassandra.store import CassandraStore

SHARDS = 16
GOAL_MS = 500.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report({**lateness_due_now(args.host, args.rate, args.seconds), **machine()}, args.json)


def _produce(url: str, rate: int, seconds: int, nudge: bool, sent: Any) -> None:
    """The producer, in its own process (as in production: an application's, not the
    poller's): ``schedule_many`` of the jobs owed every 5 ms, each due now."""
    store = CassandraStore(url)
    client = Client(store, settings=Settings(nudge=nudge))
    t0 = time.monotonic()
    try:
        while (elapsed := time.monotonic() - t0) < seconds:
            owed = int(elapsed * rate) - sent.value
            if owed > 0:
                now = datetime.now(UTC)
                client.schedule_many([JobSpec(f"n{sent.value + i}", now, "noop") for i in range(owed)])
                sent.value += owed
            time.sleep(0.005)
    finally:
        client.close()
        store.close()


def _run(host: str, rate: int, seconds: int, nudge: bool) -> dict[str, Any]:
    store = fresh_store(host, "bench_due_now", SHARDS)
    samples: list[float] = []
    lock = threading.Lock()

    def handler(job: Job) -> None:
        late = time.time() * 1000 - job.due_ms
        with lock:
            samples.append(late)

    poller = Poller(store, App.for_function(handler), config=PollerConfig(poll_interval_s=1.0))
    poller.start(range(SHARDS))
    # The producer reads the owners from the store: wait until the poller is listed.
    deadline = time.monotonic() + 30
    while nudge and not store.notify_endpoints(int(time.time() * 1000)) and time.monotonic() < deadline:
        time.sleep(0.05)
    ctx = multiprocessing.get_context("spawn")
    sent = ctx.Value("q", 0)
    producer = ctx.Process(target=_produce, args=(store.url, rate, seconds, nudge, sent), daemon=True)
    try:
        producer.start()
        producer.join(seconds + 60)
        wait_until = time.monotonic() + 30
        while len(samples) < sent.value and time.monotonic() < wait_until:
            time.sleep(0.1)
        nudged = poller.stats.nudged
    finally:
        if producer.is_alive():
            producer.kill()
        poller.stop()
        drop(store)
        store.close()
    samples.sort()
    n = len(samples)
    return {"scheduled": int(sent.value), "fired": n, "nudged": nudged,
            "p50_ms": round(samples[n // 2], 1), "p99_ms": round(samples[int(n * 0.99)], 1),
            "max_ms": round(samples[-1], 1)}


def lateness_due_now(host: str, rate: int, seconds: int) -> dict[str, Any]:
    fast = _run(host, rate, seconds, nudge=True)
    slow = _run(host, rate, seconds, nudge=False)
    met = fast["p99_ms"] < GOAL_MS and fast["fired"] == fast["scheduled"]
    return {"benchmark": "lateness_due_now", "rate_per_s": rate, "seconds": seconds,
            "fast_path": fast, "without_nudges": slow,
            "ratio_p99": round(fast["p99_ms"] / slow["p99_ms"], 3),
            "goal": f"p99 < {GOAL_MS:.0f} ms at {rate} jobs/s", "met": met}


if __name__ == "__main__":
    main()
