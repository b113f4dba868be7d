"""``audit_cost``: the completeness audit of a range holding N jobs (1,000,000 by
default), next to a plain full read of the same partitions in the same run.

    .venv/bin/python -m bench.audit [--jobs N] [--json]

The jobs are written with ``Store.insert_many`` (bucket rows and lookup rows, as the
client writes them) over the buckets of one hour starting an hour from now, S = 16.
The baseline is a bare driver loop: every partition of the range read with the same
prepared statement, 64 at a time, each paged to the end, rows counted and dropped. The
audit reads the same partitions and, for each job, its lookup row (``lookup_rows``, a
chunk at once); its cost over the baseline is that second read. Both run twice, alternating; the figures
are the faster of each.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from cassandra.concurrent import execute_concurrent

from bench.common import drop, fresh_store, machine, report, settle
from scheduler.domain.clock import SystemClock
from scheduler.domain.keys import bucket_of_ms, shard_of
from scheduler.domain.model import Job
from scheduler.observe.audit import HOUR_MS, audit
from scheduler.store.cassandra.store import CassandraStore

SHARDS = 16


def load(store: CassandraStore, n: int, start_ms: int) -> float:
    """``n`` jobs spread evenly over the hour from ``start_ms``; returns jobs/s."""
    t0 = time.perf_counter()
    chunk = 20_000
    for i in range(0, n, chunk):
        jobs = []
        for k in range(i, min(n, i + chunk)):
            fire = start_ms + k * HOUR_MS // n
            job_id = f"a{k}"
            jobs.append(Job(job_id=job_id, kind="k", data=b"{}", data_json=True, due_ms=fire, fire_ms=fire,
                            bucket=bucket_of_ms(fire, 60), shard=shard_of(job_id, SHARDS)))
        store.insert_many(jobs)
    return n / (time.perf_counter() - t0)


def plain_read(store: CassandraStore, start_ms: int) -> tuple[float, int]:
    """Every row of every partition of the hour, bare driver; returns (seconds, rows)."""
    stmt = store.prepared("select_bucket_rows")  # the poller's read
    first = bucket_of_ms(start_ms, 60)
    parts = [(b, s) for b in range(first, first + 3600, 60) for s in range(SHARDS)]
    t0 = time.perf_counter()
    rows = 0
    for i in range(0, len(parts), 64):
        params = [(stmt, _params(b, s)) for b, s in parts[i:i + 64]]
        for ok, result in execute_concurrent(store.session, params, concurrency=64):
            assert ok
            rows += sum(1 for _ in result)  # iterating pages through to the end
    return time.perf_counter() - t0, rows


def _params(bucket: int, shard: int) -> tuple[Any, ...]:
    return (bucket, shard, bucket * 1000 - 1, "", 2**62, 1_000_000)  # the whole partition


def run(host: str, n: int) -> dict[str, Any]:
    start_ms = (SystemClock().now_ms() // HOUR_MS + 1) * HOUR_MS
    store = fresh_store(host, "bench_audit", SHARDS)
    try:
        rate = load(store, n, start_ms)
        settled = settle()
        reads, audits = [], []
        report_ = None
        for _ in range(2):
            secs, rows = plain_read(store, start_ms)
            reads.append(secs)
            assert rows == n, (rows, n)
            t0 = time.perf_counter()
            report_ = audit(store, start_ms, start_ms + HOUR_MS - 1)
            audits.append(time.perf_counter() - t0)
        assert report_ is not None and report_.totals()["written"] == n and not report_.violations
        read_s, audit_s = min(reads), min(audits)
        return {"jobs": n, "partitions": len(report_.partitions), "load_jobs_per_s": round(rate),
                "settled_s": settled, "plain_read_s": round(read_s, 2), "audit_s": round(audit_s, 2),
                "audit_jobs_per_s": round(n / audit_s), "ratio": round(audit_s / read_s, 2),
                "runs": {"plain_read_s": [round(x, 2) for x in reads],
                         "audit_s": [round(x, 2) for x in audits]},
                "machine": machine()}
    finally:
        drop(store)
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report(run(args.host, args.jobs), args.json)


if __name__ == "__main__":
    main()
