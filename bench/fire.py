"""``fire_throughput``: one poller with a no-op handler draining M overdue jobs, next to
bare driver loops over the same rows, each on its own copy of the data:

- the read-and-mark loop (the goal's baseline): the poller's reads (page through every
  partition) and writes (``fired_at`` in single-partition batches of 50, bound the
  driver's usual way);
- the same with the poller's own ``FastBinder`` for the batches (what is left to win in
  the poller's threads once the driver's per-row binding is gone too);
- the read-only loop: the same reads and no writes, the floor under both (how much of
  the time is reading, and how much recording).

Paired rounds; each ratio is the median of the per-round ratios. Goal: poller over the
read-and-mark loop >= 1.0 (the poller records firings in batches that list them, one
row per partition and batch, where that loop writes a cell per job), and >= 5,000 jobs/s.

    .venv/bin/python -m bench.poller --only fire_throughput [--fire-jobs N] [--fire-rounds R]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from cassandra.concurrent import execute_concurrent
from cassandra.query import BatchStatement, BatchType

from bench.common import cassandra_cpu_s, drop, fresh_store, own_cpu_s, settle, write_bucket_rows
from bench.fastbind import FastBinder
from scheduler import App, Job
from scheduler.domain.clock import SystemClock
from scheduler.domain.keys import bucket_of_ms, shard_of
from scheduler.poller import Poller, PollerConfig
from scheduler.store.cassandra.store import CassandraStore

SHARDS = 16
PAGE = 2000  # rows per read, as the poller's read_limit below


def load_overdue(store: CassandraStore, n: int, now: int) -> list[Job]:
    """``n`` jobs due over the last 50 s: a poller catching up after downtime. Only
    their bucket rows are written (all that firing reads and records)."""
    jobs = []
    for i in range(n):
        fire = now - 50_000 + i * 50_000 // n
        job_id = f"od-{i}"
        jobs.append(Job(job_id=job_id, kind="noop", data=b"{}", data_json=True, due_ms=fire, fire_ms=fire,
                        bucket=bucket_of_ms(fire, 60), shard=shard_of(job_id, SHARDS)))
    write_bucket_rows(store, jobs)
    return jobs


def overdue_store(host: str, n: int, now: int) -> CassandraStore:
    store = fresh_store(host, "bench_fire", SHARDS, now_ms=now - 120_000)
    load_overdue(store, n, now)
    return store


def fire_all(poller: Poller, n: int, shards: int, now: int | None = None) -> float:
    """Claim ``shards`` shards (untimed: one LWT each is not firing), then start the poller:
    the seconds until it fired ``n`` jobs (at most 600), after which it is stopped."""
    for shard in range(shards):
        poller.claim(shard, now)
    t0 = time.perf_counter()
    poller.start()
    while poller.stats.fired < n and time.perf_counter() - t0 < 600:
        time.sleep(0.005)
    elapsed = time.perf_counter() - t0
    poller.stop()
    return elapsed


def _fire_poller(store: CassandraStore, n: int, now: int) -> float:
    poller = Poller(store, App.for_function(lambda job: None),
                    config=PollerConfig(concurrency=int(os.environ.get("BENCH_CONCURRENCY", "16")),
                                        read_limit=PAGE, max_buffered=50_000))
    return fire_all(poller, n, SHARDS, now)


def _pages(store: CassandraStore, now: int) -> Iterator[list[Any]]:
    """Every page of due rows, partition by partition, as the poller reads them: the
    bare loops' shared read path (one query in flight at a time, rows materialized)."""
    read = store.prepared("select_bucket_rows")
    for bucket in range(bucket_of_ms(now - 50_000, 60), bucket_of_ms(now, 60) + 1, 60):
        for shard in range(SHARDS):
            after: tuple[int, str] = (bucket * 1000 - 1, "")
            while True:
                rows = list(store.session.execute(read, (bucket, shard, after[0], after[1], 2**62, PAGE)))
                if not rows:
                    break
                yield rows
                last = rows[-1]
                after = (int(last[2]), last[3])
                if len(rows) < PAGE:
                    break


def _fire_bare(store: CassandraStore, n: int, now: int, fast_bind: bool = False) -> float:
    """The same reads (every partition, paged) and writes (fired_at in single-partition
    batches of 50) as the poller, in a plain loop. ``fast_bind``: the batches are built
    with the poller's own ``FastBinder`` instead of the driver's ``BatchStatement.add``
    (the loop's limit with the binding cost the poller avoids removed too)."""
    upd = store.prepared("mark_fired")
    binder = FastBinder(upd)
    ttl = store.retention.jobs_s
    t0 = time.perf_counter()
    for rows in _pages(store, now):
        batches: list[tuple[Any, None]] = []
        for i in range(0, len(rows), 50):
            params = [(ttl, now, r[0], r[1], r[2], r[3]) for r in rows[i:i + 50]]
            if fast_bind:
                batches.append((binder.batch(params), None))
                continue
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for p in params:
                batch.add(upd, p)
            batches.append((batch, None))
        execute_concurrent(store.session, batches, concurrency=128)
    return time.perf_counter() - t0


def _read_only(store: CassandraStore, n: int, now: int) -> float:
    """Only the reads of ``_fire_bare``: the seconds to page through every due row.
    Raises if it saw other than ``n`` rows (a figure over the wrong data is no figure)."""
    t0 = time.perf_counter()
    seen = sum(len(rows) for rows in _pages(store, now))
    elapsed = time.perf_counter() - t0
    if seen != n:
        raise RuntimeError(f"read-only loop saw {seen:,} rows, expected {n:,}")
    return elapsed


def _with_cpu(cpu: dict[str, tuple[float, float]], name: str, n: int, fn: Callable[..., float],
              *args: Any) -> float:
    """``fn(*args)``'s result (seconds); its CPU per job, this process's and Cassandra's
    (µs), into ``cpu[name]``."""
    own, cass = own_cpu_s(), cassandra_cpu_s()
    elapsed = fn(*args)
    cpu[name] = ((own_cpu_s() - own) / n * 1e6, (cassandra_cpu_s() - cass) / n * 1e6)
    return elapsed


def fire_throughput(host: str, n: int, rounds: int = 5) -> dict[str, Any]:
    """Paired rounds, the order alternating; the ratio is the median of the per-round
    ratios. The bare loop alone ranges 26k-36k jobs/s across runs on this machine: a
    pair measured back to back shares most of that drift, and the median drops an
    outlier pair (the best of each side, used before, paired unrelated moments)."""
    per_round: list[dict[str, float]] = []
    for i in range(rounds):
        # All four data sets are loaded first, then fired back to back: loops measured
        # seconds apart share the machine's state (loading between them did not).
        now = SystemClock().now_ms()
        stores = [overdue_store(host, n, now) for _ in range(4)]
        # The loads' flushes and compactions are no side's work: without this wait they
        # ran under whichever side went first, and its Cassandra CPU per job with them.
        settle(max_s=30)
        cpu: dict[str, tuple[float, float]] = {}
        try:
            if i % 2 == 0:
                p = _with_cpu(cpu, "poller", n, _fire_poller, stores[0], n, now)
                b = _with_cpu(cpu, "bare", n, _fire_bare, stores[1], n, now)
                r = _with_cpu(cpu, "read_only", n, _read_only, stores[3], n, now)
            else:
                r = _with_cpu(cpu, "read_only", n, _read_only, stores[3], n, now)
                b = _with_cpu(cpu, "bare", n, _fire_bare, stores[1], n, now)
                p = _with_cpu(cpu, "poller", n, _fire_poller, stores[0], n, now)
            f = _fire_bare(stores[2], n, now, fast_bind=True)
        finally:
            for store in stores:
                drop(store)
                store.close()
        per_round.append({"poller": n / p, "bare": n / b, "fast": n / f, "read_only": n / r,
                          **{f"{side}_{who}_us": v[k] for side, v in cpu.items()
                             for k, who in enumerate(("client", "cassandra"))}})
        print(f"  round {i + 1}/{rounds}: poller {n / p:,.0f} jobs/s, bare {n / b:,.0f} jobs/s, "
              f"bare with fast binding {n / f:,.0f} jobs/s, read-only {n / r:,.0f} jobs/s", file=sys.stderr)
    return fire_figures(n, per_round)


def fire_figures(n: int, per_round: list[dict[str, float]]) -> dict[str, Any]:
    """The report from each round's rates (jobs/s of "poller", "bare", "fast" and
    "read_only"): medians of the rates and of the per-round ratios."""

    def med(key: str, over: str | None = None) -> float:
        return statistics.median(r[key] / r[over] if over else r[key] for r in per_round)

    def spread(key: str, over: str | None = None, digits: int = 0) -> list[float]:
        """The lowest and highest round, next to the median: how far one round can be off."""
        vals = [r[key] / r[over] if over else r[key] for r in per_round]
        return [round(min(vals), digits or None), round(max(vals), digits or None)]

    ratio, rate = med("poller", "bare"), med("poller")
    return {"jobs": n, "rounds": len(per_round), "poller_jobs_per_s": round(rate),
            "poller_jobs_per_s_spread": spread("poller"),
            "bare_loop_jobs_per_s": round(med("bare")), "bare_loop_jobs_per_s_spread": spread("bare"),
            "ratio": round(ratio, 3), "ratio_spread": spread("poller", "bare", 3),
            "ratio_is": "median of per-round ratios",
            "per_round": [{"poller": round(r["poller"]), "bare": round(r["bare"]),
                           "read_only": round(r["read_only"]), "ratio": round(r["poller"] / r["bare"], 3)}
                          for r in per_round],
            # Not the goal's baseline: how far the poller's threads are from a loop that
            # also skips the driver's per-row binding (what is left to win in the poller).
            "ratio_vs_fast_bind_loop": round(med("poller", "fast"), 3),
            # The floor: the same reads with nothing recorded. 1 - bare/read-only is the
            # share of the bare loop's time spent writing fired_at.
            "read_only_jobs_per_s": round(med("read_only")),
            "read_only_jobs_per_s_spread": spread("read_only"),
            "ratio_poller_vs_read_only": round(med("poller", "read_only"), 3),
            "ratio_bare_vs_read_only": round(med("bare", "read_only"), 3),
            # Where each side's time goes: CPU per job of this process (the poller's
            # threads, or the loop) and of Cassandra, medians over the rounds.
            "cpu_us_per_job": {side: {who: round(med(f"{side}_{who}_us"), 1)
                                      for who in ("client", "cassandra")}
                               for side in ("poller", "bare", "read_only")
                               if f"{side}_client_us" in per_round[0]},
            "goal": ">= 1.0 and >= 5000 jobs/s", "met": ratio >= 1.0 and rate >= 5000}
