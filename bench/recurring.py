"""Recurring schedules against one-shot jobs, on one poller and a single-node Cassandra:

- ``recurring``: N schedules a minute (100,000, quick too), as N/60 per second:
  ``N * period / 60`` schedules every ``period`` (60 s; quick: 10 s, so 16,666
  schedules at the same rate in a sixth of the time), their start times spread over the
  period. One poller fires them
  for a period, then is measured over the next ``measure`` seconds (60; quick: 15):
  steady state, each occurrence written by the poller itself, from the previous one:
  - p99 lateness of the handler's start against ``scheduled_for``. Goal: under 1 s.
  - CPU seconds of this process per occurrence (reading it, reading its schedule once,
    batched, writing the next occurrence blind, recording), against the same for one-shot jobs at the
    same rate in the same run, producer's writes included (a one-shot job is written by
    a producer; an occurrence by the poller). Goal: at most 1.2x.

    .venv/bin/python -m bench.recurring [--quick] [--schedules N-PER-MINUTE] [--json]
"""

from __future__ import annotations

import argparse
import threading
import time
from datetime import UTC, datetime
from typing import Any

from bench.common import drop, fresh_store, machine, own_cpu_s, report
from scheduler import App, Client, Job, JobSpec
from scheduler.domain.clock import SystemClock
from scheduler.poller import Poller, PollerConfig
from scheduler.producer import occurrences as writes
from scheduler.recurring.rule import Rule
from scheduler.recurring.schedule import Schedule
from scheduler.store.cassandra.store import CassandraStore
from scheduler.store.rows import schedule_params

SHARDS = 16
FULL_PERIOD_S, FULL_MEASURE_S = 60, 60
QUICK_PERIOD_S, QUICK_MEASURE_S = 10, 15
# How long after the run's start the first occurrence (recurring: plus 1 ms a schedule,
# the time to write them) or the first one-shot job is due; more than the late margin
# (3 s) after their writes, so none is placed later than due. Quick writes a sixth as many.
FULL_LEAD_S, QUICK_LEAD_S = 10, 5


class Sampler:
    """Handler: lateness against scheduled_for (or due_at), counted in a time window."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.window: tuple[float, float] = (0.0, 0.0)
        self.samples: list[float] = []
        # Second of the window (by start time) -> [starts, worst lateness ms]: when the
        # late starts happened, which a p99 alone does not say.
        self.seconds: dict[int, list[float]] = {}
        self.total = 0

    def __call__(self, job: Job) -> None:
        now = time.time()
        nominal = job.scheduled_for.timestamp() if job.scheduled_for is not None else job.due_ms / 1000
        late = (now - nominal) * 1000
        with self.lock:
            self.total += 1
            if self.window[0] <= now < self.window[1]:
                self.samples.append(late)
                sec = self.seconds.setdefault(int(now - self.window[0]), [0, 0.0])
                sec[0] += 1
                sec[1] = max(sec[1], late)

    def worst_seconds(self, n: int = 5) -> list[dict[str, float]]:
        """The ``n`` seconds of the window with the latest start, in time order."""
        worst = sorted(self.seconds.items(), key=lambda kv: kv[1][1], reverse=True)[:n]
        return [{"second": s, "starts": int(c), "max_ms": round(m, 1)} for s, (c, m) in sorted(worst)]


def create_schedules(store: CassandraStore, n: int, start_ms: int, period_s: int) -> float:
    """``n`` schedules every ``period_s``, starts spread over the period, and each one's
    first occurrence; returns seconds taken. (Concurrent writes: the API's one call per
    schedule is not what is measured here.)"""
    t0 = time.perf_counter()
    client = Client(store)
    schedules = []
    for i in range(n):
        anchor = start_ms + i * period_s * 1000 // n
        schedules.append(Schedule(f"s{i}", "tick", Rule(every_s=period_s, anchor_ms=anchor), start_ms=anchor,
                                  created_ms=start_ms, updated_ms=start_ms))
    stmt = store.prepared("insert_schedule")
    for i in range(0, n, 5000):
        store._concurrent([(stmt, schedule_params(s)) for s in schedules[i:i + 5000]], "bench schedules")
    jobs = [client.run(writes.place(client.producer, s, s.rule.anchor_ms)) for s in schedules]
    for i in range(0, n, 5000):
        client.run(writes.write(client.producer, jobs[i:i + 5000]))
    return time.perf_counter() - t0


def run_recurring(host: str, per_minute: int, period_s: int, measure_s: int,
                  lead_s: int = FULL_LEAD_S) -> dict[str, Any]:
    n = per_minute * period_s // 60
    now = SystemClock().now_ms()
    store = fresh_store(host, "bench_rec", SHARDS, now_ms=now - 120_000)
    try:
        # Time to write them first (measured: 85 s for 100,000 here, about 1 ms each).
        start_ms = now + lead_s * 1000 + n
        setup_s = create_schedules(store, n, start_ms, period_s)
        sampler = Sampler()
        poller = Poller(store, App.for_function(sampler), config=PollerConfig(concurrency=16))
        poller.start(range(SHARDS))
        begin = start_ms / 1000 + period_s
        sampler.window = (begin, begin + measure_s)
        time.sleep(max(0.0, begin - time.time()))
        fired0, cpu0 = poller.stats.fired, own_cpu_s()
        time.sleep(measure_s)
        fired, cpu = poller.stats.fired - fired0, own_cpu_s() - cpu0
        poller.stop()
    finally:
        drop(store)
        store.close()
    samples = sorted(sampler.samples)
    return {"schedules": n, "every_s": period_s, "per_minute": per_minute, "measured_s": measure_s,
            "setup_s": round(setup_s, 1), "fired_in_window": fired,
            "expected_in_window": n * measure_s // period_s,
            "p50_ms": round(samples[len(samples) // 2], 1) if samples else None,
            "p99_ms": round(samples[int(len(samples) * 0.99)], 1) if samples else None,
            "max_ms": round(samples[-1], 1) if samples else None,
            "late_over_1s": sum(1 for v in samples if v > 1000),
            "worst_seconds": sampler.worst_seconds(),
            "cpu_ms_per_job": round(cpu * 1000 / max(1, fired), 3)}


def run_one_shot(host: str, per_minute: int, measure_s: int, lead_s: int = FULL_LEAD_S) -> dict[str, Any]:
    """The same rate of one-shot jobs for ``measure_s``: a producer thread writes each
    8 s ahead (as a producer would), the poller fires them."""
    now = SystemClock().now_ms()
    store = fresh_store(host, "bench_one", SHARDS, now_ms=now - 120_000)
    client = Client(store)
    sampler = Sampler()
    poller = Poller(store, App.for_function(sampler), config=PollerConfig(concurrency=16))
    rate = per_minute / 60
    try:
        poller.start(range(SHARDS))
        start = time.time() + lead_s
        sampler.window = (start + 5, start + 5 + measure_s)
        halt = threading.Event()

        def produce() -> None:
            i, t = 0, start
            while not halt.is_set():
                batch = [JobSpec(f"o{i + k}", datetime.fromtimestamp(t + k / rate, UTC), "tick")
                         for k in range(int(rate))]
                client.schedule_many(batch)
                i, t = i + len(batch), t + len(batch) / rate
                halt.wait(max(0.0, t - 8 - time.time()))  # stay 8 s ahead

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        time.sleep(max(0.0, sampler.window[0] - time.time()))
        fired0, cpu0 = poller.stats.fired, own_cpu_s()
        time.sleep(measure_s)
        fired, cpu = poller.stats.fired - fired0, own_cpu_s() - cpu0
        halt.set()
        producer.join(timeout=30)
        poller.stop()
    finally:
        drop(store)
        store.close()
    samples = sorted(sampler.samples)
    return {"jobs_per_s": round(rate, 1), "fired_in_window": fired,
            "p99_ms": round(samples[int(len(samples) * 0.99)], 1) if samples else None,
            "cpu_ms_per_job": round(cpu * 1000 / max(1, fired), 3)}


def recurring(host: str, per_minute: int, quick: bool = False) -> dict[str, Any]:
    """Recurring occurrences against one-shot jobs at ``per_minute``; ``quick`` runs
    the shorter period and window (the same rate)."""
    period_s, measure_s, lead_s = ((QUICK_PERIOD_S, QUICK_MEASURE_S, QUICK_LEAD_S) if quick
                                   else (FULL_PERIOD_S, FULL_MEASURE_S, FULL_LEAD_S))
    rec = run_recurring(host, per_minute, period_s, measure_s, lead_s)
    one = run_one_shot(host, per_minute, measure_s, lead_s)
    ratio = rec["cpu_ms_per_job"] / one["cpu_ms_per_job"] if one["cpu_ms_per_job"] else None
    met = (rec["p99_ms"] is not None and rec["p99_ms"] < 1000 and ratio is not None and ratio <= 1.2
           and rec["fired_in_window"] >= 0.99 * rec["expected_in_window"])
    return {"recurring": rec, "one_shot": one, "p99_ms": rec["p99_ms"],
            "cost_ratio": None if ratio is None else round(ratio, 2),
            "goal": "p99 < 1 s and cost <= 1.2x a one-shot job", "met": met}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--schedules", type=int)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    n = args.schedules or 100_000
    report({"machine": machine(), "quick": args.quick, "recurring": recurring(args.host, n, args.quick)},
           args.json)


if __name__ == "__main__":
    main()
