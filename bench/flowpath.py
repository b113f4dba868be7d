"""``flow_path_cost``: what having limits set costs per job in a poller's queues, measured
in process without a store, so without the store's noise.

It runs the poller's own queue code (``FlowQueue``: the due queue, the fair queue and
each kind's gate) as the reader, the dispatcher and the recorder drive it: the jobs are
pushed (as read), taken once due in chunks of ``CHUNK`` (the dispatcher's
``pop_ready``), and finished (``finished_many``) when their outcomes are recorded and, on
the side with limits, also when their handlers return (so a slot is free at once), as
the poller does. One side has limits on the jobs' kind that do not bind (a rate of
1,000,000/s and a concurrency of 1,000, as ``flow_control_overhead`` sets; a refused start
fails the run); the other has none. Both sides run the whole queue: the figure is the
cost of the limits, not of the queue. Each side runs ``REPEATS`` times, alternating, on
this thread's CPU clock; reported: each side's fastest run (noise only ever adds time),
and the median and range of the paired differences. Not modelled: the dispatcher's
per-pass work (``excess``, ``recall``, refusal counts), and the reader's pages (all jobs
are pushed at once). The workload is one kind with no keys at one priority.

    .venv/bin/python -m bench.flowpath [--jobs 60000] [--poller-us-per-job 30] [--json]
"""

from __future__ import annotations

import argparse
import statistics
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
    """CPU seconds of this thread to push, take and finish every job through a fresh
    ``FlowQueue``."""
    fq = FlowQueue(DueQueue(), time.monotonic, max_buffered=len(jobs))
    if limited:
        fq.set_limits(Limits(KIND, rate_per_s=1_000_000.0, concurrency=1000), 1_000_000.0, 1000)
    now_ms = jobs[0].fire_ms
    taken = 0
    start = time.thread_time()
    for job in jobs:
        fq.push(job)
    while taken < len(jobs):
        chunk = fq.pop_ready(now_ms, CHUNK)
        if not chunk or fq.fair.throttled:
            raise RuntimeError(f"the queue refused starts after {taken} of {len(jobs)} jobs "
                               f"({dict(fq.fair.throttled)}): the limits bind")
        taken += len(chunk)
        if limited:  # the handlers returned (``Core.handled``: only while a kind has limits)
            fq.finished_many(chunk)
        fq.finished_many(chunk)  # the outcomes were recorded (the recorder)
    return time.thread_time() - start


def flow_path_cost(jobs: int = 60_000, poller_us_per_job: float | None = None) -> dict[str, Any]:
    batch = _jobs(jobs, 1_800_000_000_000)
    runs: dict[bool, list[float]] = {True: [], False: []}
    for i in range(REPEATS):
        for limited in ((True, False) if i % 2 == 0 else (False, True)):
            runs[limited].append(1e6 * _drain(batch, limited) / jobs)
    lim_us, free_us = min(runs[True]), min(runs[False])
    diffs = [a - b for a, b in zip(runs[True], runs[False], strict=True)]
    extra = lim_us - free_us
    out: dict[str, Any] = {
        "jobs": jobs, "repeats": REPEATS, "chunk": CHUNK, "workload": "one kind, no keys, one priority",
        "limits": "rate 1,000,000/s, concurrency 1,000 (not binding: no start refused)",
        "limited_us_per_job": round(lim_us, 3), "unlimited_us_per_job": round(free_us, 3),
        "extra_us_per_job": round(extra, 3),
        "paired_extra_us_median": round(statistics.median(diffs), 3),
        "paired_extra_us_range": [round(min(diffs), 3), round(max(diffs), 3)],
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
