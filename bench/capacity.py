"""The capacity model of ``docs/CAPACITY.md`` as code: from a target (jobs due per
minute, peak-to-mean ratio, retention, handler time) to pollers, shards, Cassandra load
and disk, with every input taken from an ``ops/bench`` key. ``check`` compares the
model's fleet throughput with ``fleet_scaling``'s measured points at 1, 2 and 4 pollers
(``capacity_model_error`` in ``ops/bench``). Pure: no I/O.

    .venv/bin/python -m bench.capacity [--report bench/out/report.json] [--jobs-per-min 1000000]
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Rows per job, from the code (scheduler/store/cassandra/store.py, fire.py): the producer
# writes the bucket row and the lookup row; the poller reads the bucket row (one range
# read per shard and poll) and marks it fired (one single-partition batch per shard and
# recorder flush). LWTs: one per shard claim and per checkpoint save, none per job.
ROWS_WRITTEN_PER_JOB = 3
ROWS_READ_PER_JOB = 1
CHECKPOINT_EVERY_S = 1.0  # PollerConfig.checkpoint_interval_s: a moved checkpoint, one LWT
# At rest a member reads ZooKeeper once per lease check, six per session timeout
# (fleet/zkcoord.py); the member list and the plan are read again only when a watch fires.
LEASE_READS_PER_SESSION = 6
SESSION_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Inputs:
    """Each from an ``ops/bench`` key (named in the field's comment)."""

    fire_jobs_per_s: float          # fire_throughput: one poller, no-op handler, draining
    fleet_1_jobs_per_s: float       # fleet_scaling: one poller, 10 ms handler, concurrency 16
    handler_s: float = 0.010        # fleet_scaling's handler
    concurrency: int = 16           # fleet_scaling's --concurrency
    bytes_per_job: float = 127.0    # storage_steady_state: disk bytes / live jobs (RF 1)
    enqueue_jobs_per_s: float = 4000.0  # enqueue: one producer process, schedule_many


@dataclass(frozen=True)
class Target:
    jobs_per_min: float = 1_000_000
    peak_to_mean: float = 2.0
    retention_days: float = 7.0
    handler_s: float = 0.010
    concurrency: int = 64
    utilisation: float = 0.5        # headroom: a poller's loss, catch-up after downtime
    replication: int = 3


def overhead_s(i: Inputs) -> float:
    """Per-job time a handler slot is busy beyond the handler (dispatch, record)."""
    return max(0.0, i.concurrency / i.fleet_1_jobs_per_s - i.handler_s)


def poller_jobs_per_s(i: Inputs, handler_s: float, concurrency: int) -> float:
    """One poller process: bounded by its handler slots and by its CPU (one core)."""
    return min(concurrency / (handler_s + overhead_s(i)), i.fire_jobs_per_s)


def fleet_jobs_per_s(i: Inputs, pollers: int, handler_s: float, concurrency: int) -> float:
    return pollers * poller_jobs_per_s(i, handler_s, concurrency)


def plan(i: Inputs, t: Target) -> dict[str, Any]:
    """Pollers, shards, Cassandra load and disk for ``t``."""
    mean = t.jobs_per_min / 60
    peak = mean * t.peak_to_mean
    per_poller = poller_jobs_per_s(i, t.handler_s, t.concurrency)
    pollers = max(1, math.ceil(peak / (per_poller * t.utilisation)))
    shards = max(16, 8 * pollers)  # 8 or more per poller: a join or leave moves small units
    return {
        "target": asdict(t), "mean_jobs_per_s": round(mean), "peak_jobs_per_s": round(peak),
        "poller_jobs_per_s": round(per_poller), "pollers": pollers, "shards": shards,
        "producer_processes_at_peak": math.ceil(peak / i.enqueue_jobs_per_s),
        "cassandra_rows_written_per_s": round(peak * ROWS_WRITTEN_PER_JOB),
        "cassandra_rows_read_per_s": round(peak * ROWS_READ_PER_JOB),
        "cassandra_lwt_per_s": round(shards / CHECKPOINT_EVERY_S, 1),
        "disk_bytes": round(t.jobs_per_min * 60 * 24 * t.retention_days * i.bytes_per_job * t.replication),
        "zookeeper_reads_per_s": round(LEASE_READS_PER_SESSION * pollers / SESSION_TIMEOUT_S),
    }


def check(i: Inputs, measured: dict[int, float]) -> dict[str, Any]:
    """The model's fleet throughput against ``fleet_scaling`` at 1, 2 and 4 pollers. The
    one-poller point calibrates the overhead, so its error is 0 by construction."""
    out = {}
    for n, real in sorted(measured.items()):
        predicted = fleet_jobs_per_s(i, n, i.handler_s, i.concurrency)
        out[str(n)] = {"measured": round(real), "predicted": round(predicted),
                       "error": round((predicted - real) / real, 3)}
    worst = max(abs(v["error"]) for v in out.values())
    return {"points": out, "max_abs_error": worst}


def from_report(report: dict[str, Any]) -> tuple[Inputs, dict[int, float]]:
    res = report["results"]
    fleet = res["fleet_scaling"]["details"]
    storage = res.get("storage_steady_state", {}).get("details")
    per_job = (storage["end"]["disk_total"] / (storage["end"]["rows_total"] / 2)) if storage else 110.0
    inputs = Inputs(fire_jobs_per_s=res["fire_throughput"]["details"]["poller_jobs_per_s"],
                    fleet_1_jobs_per_s=fleet["pollers_1_jobs_per_s"], bytes_per_job=round(per_job, 1),
                    enqueue_jobs_per_s=res.get("enqueue", {}).get("value") or 4000.0)
    measured = {n: float(fleet[f"pollers_{n}_jobs_per_s"]) for n in (1, 2, 4)}
    return inputs, measured


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", default="bench/out/report.json")
    ap.add_argument("--jobs-per-min", type=float, default=1_000_000)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    inputs, measured = from_report(json.loads(Path(args.report).read_text()))
    target = Target(jobs_per_min=args.jobs_per_min, concurrency=args.concurrency)
    print(json.dumps({"inputs": asdict(inputs), "check": check(inputs, measured),
                      "plan": plan(inputs, target)}, indent=2))


if __name__ == "__main__":
    main()
