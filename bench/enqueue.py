"""Enqueue throughput: ``Client.schedule_many`` against a bare cassandra-driver loop that
inserts the same two rows per job (bucket row and lookup row) with the same concurrency.

    .venv/bin/python -m bench.enqueue [--jobs N] [--rounds R] [--host 127.0.0.1] [--json]

Rounds alternate baseline and library on one single-node Cassandra, in one process, and
the best round of each is compared (noisy machines: best-of is the stable statistic).
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from typing import Any

from cassandra.concurrent import execute_concurrent_with_args

from bench.common import drop, fresh_store, machine, report, timed
from scheduler import Client, Job, JobSpec
from scheduler.store.cassandra.bind import bucket_params, job_params


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report({**enqueue(args.host, args.jobs, args.rounds), **machine()}, args.json)


def enqueue(host: str, jobs: int, rounds: int) -> dict[str, Any]:
    """Best round of the library against the best round of the bare loop."""
    store = fresh_store(host, "bench_enqueue")
    client = Client(store)
    start = datetime.now(UTC) + timedelta(minutes=5)
    p_bucket, p_job = store.prepared("insert_bucket_row"), store.prepared("insert_job")
    best_lib = best_bare = float("inf")
    try:
        for r in range(rounds):
            specs = [JobSpec(f"lib-{r}-{i}", start + timedelta(milliseconds=i * 37), "bench", {"i": i})
                     for i in range(jobs)]
            # The bare loop writes exactly the rows the library would write for these jobs.
            rows = [client.build(JobSpec(f"bare-{r}-{i}", s.due_at, s.kind, s.payload))
                    for i, s in enumerate(specs)]

            def bare(rows: list[Job] = rows) -> None:
                pairs = [(j, store.job_ttl(j)) for j in rows]
                bucket_rows = [(*bucket_params(j), t) for j, t in pairs]
                execute_concurrent_with_args(store.session, p_bucket, bucket_rows,
                                             concurrency=store.concurrency)
                execute_concurrent_with_args(store.session, p_job, [(*job_params(j), t) for j, t in pairs],
                                             concurrency=store.concurrency)

            def lib(specs: list[JobSpec] = specs) -> None:
                client.schedule_many(specs)

            best_bare = min(best_bare, timed(bare))
            best_lib = min(best_lib, timed(lib))
        lib_rate, bare_rate = jobs / best_lib, jobs / best_bare
        return {"benchmark": "enqueue", "jobs_per_round": jobs, "rounds": rounds,
                "library_jobs_per_s": round(lib_rate), "bare_driver_jobs_per_s": round(bare_rate),
                "ratio": round(lib_rate / bare_rate, 3), "goal": ">= 0.8", "met": lib_rate / bare_rate >= 0.8}
    finally:
        drop(store)
        client.close()
        store.close()


if __name__ == "__main__":
    main()
