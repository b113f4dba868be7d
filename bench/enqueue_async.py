"""``enqueue_async``: ``AsyncClient.schedule`` called once per job from many concurrent
tasks, against ``Client.schedule_many`` of the same jobs (the baseline: the fastest way
to write them) and against ``Client.schedule`` called from a thread pool (what an app
without an async client does).

    .venv/bin/python -m bench.enqueue_async [--jobs 100000] [--tasks 1000] [--threads 32]
                                            [--rounds 2] [--host 127.0.0.1] [--json]

All three run in one process on one single-node Cassandra, in alternating rounds, and
the best round of each is compared (noisy machines: best-of is the stable statistic).
Goal: the async rate at least 0.8 of ``schedule_many``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from bench.common import drop, fresh_store, machine, report, timed
from scheduler import AsyncClient, Client, JobSpec

GOAL = 0.8


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--tasks", type=int, default=1_000)
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report({**enqueue_async(args.host, args.jobs, args.tasks, args.threads, args.rounds), **machine()},
           args.json)


def _specs(prefix: str, jobs: int) -> list[JobSpec]:
    """Jobs due from 10 minutes on: never within the late margin, whenever a round runs."""
    start = datetime.now(UTC) + timedelta(minutes=10)
    return [JobSpec(f"{prefix}-{i}", start + timedelta(milliseconds=i * 37), "bench", {"i": i})
            for i in range(jobs)]


async def _async_round(client: AsyncClient, specs: list[JobSpec], tasks: int) -> float:
    """Seconds for ``tasks`` tasks to schedule every spec, one call per job."""
    it = iter(specs)

    async def worker() -> None:
        for s in it:  # one shared iterator: the tasks take the next job in turn
            await client.schedule(s.job_id, s.due_at, s.kind, s.payload)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(tasks)))
    return time.perf_counter() - t0


def enqueue_async(host: str, jobs: int, tasks: int, threads: int, rounds: int) -> dict[str, Any]:
    store = fresh_store(host, "bench_enqueue_async")
    client = Client(store)
    aclient = AsyncClient(store)
    best = {"async": float("inf"), "many": float("inf"), "threads": float("inf")}
    loop = asyncio.new_event_loop()
    try:
        for r in range(rounds):
            many = _specs(f"many-{r}", jobs)
            best["many"] = min(best["many"], timed(partial(client.schedule_many, many)))
            specs = _specs(f"async-{r}", jobs)
            best["async"] = min(best["async"], loop.run_until_complete(_async_round(aclient, specs, tasks)))
            # The threads' baseline is a tenth as fast: a quarter of the jobs measures its
            # rate as well, in a quarter of the time.
            threaded = _specs(f"thr-{r}", max(1, jobs // 4))
            with ThreadPoolExecutor(threads) as pool:
                def run_threads(t: list[JobSpec] = threaded) -> None:
                    list(pool.map(lambda s: client.schedule(s.job_id, s.due_at, s.kind, s.payload), t))
                best["threads"] = min(best["threads"], timed(run_threads) * 4)
        rate = {k: jobs / v for k, v in best.items()}
        ratio = rate["async"] / rate["many"]
        return {"benchmark": "enqueue_async", "jobs_per_round": jobs, "tasks": tasks, "threads": threads,
                "rounds": rounds, "async_jobs_per_s": round(rate["async"]),
                "schedule_many_jobs_per_s": round(rate["many"]),
                "sync_threads_jobs_per_s": round(rate["threads"]),
                "ratio": round(ratio, 3), "ratio_vs_threads": round(rate["async"] / rate["threads"], 2),
                "goal": f">= {GOAL} of schedule_many", "met": ratio >= GOAL}
    finally:
        loop.close()
        drop(store)
        client.close()
        store.close()


if __name__ == "__main__":
    main()
