"""``flow_path_cost``: the CPU that flow control adds per job on a poller's hot path,
measured in process without a store, so without the store's noise.

What it runs is the poller's own queue code (``FlowQueue``: the due queue, the fair queue
and each kind's gate), driven as the dispatcher and the recorder drive it: the jobs due
at one instant are taken in chunks of ``CHUNK`` (the dispatcher's ``pop_ready``), and
each chunk is finished (``finished_many``) when its outcomes are recorded and, on the side
with limits, also when its handlers return (so a slot is free at once), as the poller
does. One side has limits on the jobs' kind that do not bind
(a rate of 1,000,000/s and a concurrency of 1,000, as ``flow_control_overhead`` sets);
the other has none. Each side runs ``REPEATS`` times, alternating, and keeps its fastest
run (the usual micro-benchmark rule: noise only ever adds time). The figure is the extra
microseconds per job, and that extra as a share of what a whole poller spends per job
(``--poller-us-per-job``, from ``flow_control_overhead``'s unlimited side).

    .venv/bin/python -m bench.flowpath [--jobs 60000] [--poller-us-per-job 30] [--json]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import machine, report
from scheduler import Job
from scheduler.domain.flow import Limits
from scheduler.poller.duequeue import DueQueue
from scheduler.poller.flowqueue import FlowQueue

CHUNK = 64  # jobs per take: the dispatcher takes what the in-flight cap leaves room for
REPEATS = 9
KIND = "noop"


def _jobs(n: int, due_ms: int) -> list[Job]:
    return [Job(job_id=f"p{i:07d}", kind=KIND, data=b"{}", data_json=True, due_ms=due_ms,
                fire_ms=due_ms, bucket=due_ms - due_ms % 60_000, shard=i % 16) for i in range(n)]


def _drain(jobs: list[Job], limited: bool) -> float:
    """CPU seconds to take and finish every job through a fresh ``FlowQueue``."""
    fq = FlowQueue(DueQueue(), time.monotonic, max_buffered=len(jobs))
    if limited:
        fq.set_limits(Limits(KIND, rate_per_s=1_000_000.0, concurrency=1000), 1_000_000.0, 1000)
    for job in jobs:
        fq.push(job)
    now_ms = jobs[0].fire_ms
    taken = 0
    start = time.process_time()
    while taken < len(jobs):
        chunk = fq.pop_ready(now_ms, CHUNK)
        if not chunk:
            raise RuntimeError(f"the queue refused starts after {taken} of {len(jobs)} jobs")
        taken += len(chunk)
        if limited:  # the handlers returned (``Core.handled``: only while a kind has limits)
            fq.finished_many(chunk)
        fq.finished_many(chunk)  # the outcomes were recorded (the recorder)
    return time.process_time() - start


def flow_path_cost(jobs: int = 60_000, poller_us_per_job: float | None = None) -> dict[str, Any]:
    batch = _jobs(jobs, 1_800_000_000_000)
    best = {True: float("inf"), False: float("inf")}
    for i in range(REPEATS):
        for limited in ((True, False) if i % 2 == 0 else (False, True)):
            best[limited] = min(best[limited], _drain(batch, limited))
    lim_us, free_us = (1e6 * best[side] / jobs for side in (True, False))
    extra = lim_us - free_us
    out: dict[str, Any] = {
        "jobs": jobs, "repeats": REPEATS, "chunk": CHUNK,
        "limits": "rate 1,000,000/s, concurrency 1,000 (not binding)",
        "limited_us_per_job": round(lim_us, 3), "unlimited_us_per_job": round(free_us, 3),
        "extra_us_per_job": round(extra, 3),
    }
    if poller_us_per_job:
        out["poller_us_per_job"] = poller_us_per_job
        out["extra_share_of_poller_cpu"] = round(extra / poller_us_per_job, 4)
        out["implied_overhead_ratio"] = round(poller_us_per_job / (poller_us_per_job + extra), 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=60_000)
    ap.add_argument("--poller-us-per-job", type=float, default=None,
                    help="a poller's CPU per job (1e6 / flow_control_overhead's unlimited jobs per CPU-s)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report({"machine": machine(), "flow_path_cost": flow_path_cost(args.jobs, args.poller_us_per_job)},
           args.json)


if __name__ == "__main__":
    main()
