"""Every benchmark in one run, written as DIR/report.json, DIR/report.md and PNG plots.
``ops/bench [--quick] [--out DIR]`` starts the servers and calls this.

Each entry of report.json has the same shape under a stable key:
``{"value", "unit", "baseline", "baseline_is", "ratio", "goal", "met", "details"}``.
``met`` is null where the issue asks only for the figure to be reported.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import api_enqueue as api_enqueue_bench
from bench import audit as audit_bench
from bench import capacity
from bench import due_now as due_now_bench
from bench import due_now_cli as due_now_cli_bench
from bench import enqueue as enqueue_bench
from bench import enqueue_async as enqueue_async_bench
from bench import fleet as fleet_bench
from bench import fleetsim as fleet_sim
from bench import flow as flow_bench
from bench import flowpath as flowpath_bench
from bench import http_targets as http_bench
from bench import peer as peer_bench
from bench import poller as poller_bench
from bench import recurring as recurring_bench
from bench import storage as storage_bench
from bench import tracing as tracing_bench
from bench import zkmodel as zkmodel_bench
from bench.backlog import backlog_steps
from bench.common import driver, drop, entry, fresh_store, settle
from bench.render import markdown, plots

SHARDS = poller_bench.SHARDS


@dataclass(frozen=True)
class Sizes:
    enqueue_jobs: int
    enqueue_rounds: int
    backlog: int  # far-future jobs: poll cost, RSS and the peer's far set
    fire_jobs: int
    fire_rounds: int  # paired rounds; the ratio is their median
    lateness_s: int
    rss_s: int
    fleet_jobs: int
    handover_s: int
    peer_near: int
    peer_window_s: float
    recurring_schedules: int
    storage: tuple[int, int, float, int | None]  # jobs/s, retention s, minutes, first snapshot s
    enqueue_async_jobs: int = 100_000
    due_now_s: int = 60
    sim_restarts: int = 1000  # fleetsim's rolling restart: how many of the 1,000 members
    audit_jobs: int = 1_000_000
    due_now_cli_batches: int = 20
    http_jobs: int = 20_000  # http_targets: jobs due at once, then 1,000/s for http_lateness_s
    http_lateness_s: int = 20
    peer_rounds: int = 3  # paired drains of the peer and `scheduler run --processes 2`


# Quick: about 15 minutes on 2 cores, servers' start included (2026-12-05: the steps' own
# times added up to 863 s). Besides these sizes, run_all
# passes quick's shorter leads (the waits before jobs fall due) and smaller scenes.
QUICK = Sizes(10_000, 2, 250_000, 20_000, 5, 10, 8, 8_000, 18, 50_000, 10.0, 100_000, storage_bench.QUICK,
              20_000, 6, 100, 50_000, due_now_cli_batches=10, http_jobs=10_000, http_lateness_s=6)
FULL = Sizes(20_000, 3, 10_000_000, 100_000, 5, 30, 30, 24_000, 45, 1_000_000, 120.0, 100_000,
             storage_bench.FULL)



def versions(host: str, zk: str, pg_url: str) -> dict[str, str]:
    out = {"python": platform.python_version()}
    store = fresh_store(host, "bench_version", 1)
    try:
        out["cassandra"] = store.release_version()
    finally:
        drop(store)
        store.close()
    zk_host, _, zk_port = zk.partition(":")
    try:
        with socket.create_connection((zk_host, int(zk_port or 2181)), timeout=5) as s:
            s.sendall(b"srvr")
            text = s.recv(4096).decode()
        out["zookeeper"] = text.splitlines()[0].split(":", 1)[1].strip().split("-")[0]
    except OSError:
        out["zookeeper"] = "unknown"
    try:
        import psycopg

        with psycopg.connect(pg_url) as conn:
            row = conn.execute(peer_bench.SQL["server_version"]).fetchone()
            out["postgres"] = str(row[0]) if row else "unknown"
    except Exception:
        out["postgres"] = "unknown"
    return out


def machine_facts() -> dict[str, Any]:
    import os

    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": cpu, "memory_gib": round(mem_gib, 1),
            "platform": platform.platform(), "cassandra_driver": driver(),
            "gc_thresholds": list(gc.get_threshold())}


def run_all(args: argparse.Namespace, sizes: Sizes) -> tuple[dict[str, Any], dict[str, Any]]:
    """The benchmarks in order; returns (report entries, raw series for the plots)."""
    results: dict[str, Any] = {}
    series: dict[str, Any] = {"lateness": [], "peer": {}}
    tmp = Path(tempfile.mkdtemp(prefix="bench-"))

    def step(name: str, fn: Callable[[], dict[str, Any]], needed: bool = False) -> None:
        """Run one benchmark under its key (``needed``: also when ``--only`` left it out,
        because a key asked for is computed from it)."""
        if args.only and name not in args.only and not needed:
            return
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        # Each benchmark starts on a quiet node: the compactions that an earlier one's
        # writes left behind otherwise load its figures (p99 lateness most of all).
        waited = settle()
        t0 = time.monotonic()
        results[name] = fn()
        results[name]["details"]["seconds"] = round(time.monotonic() - t0, 1)
        results[name]["details"]["settled_s"] = waited
        print(f"[bench]   {json.dumps(results[name])}", file=sys.stderr, flush=True)

    def enqueue() -> dict[str, Any]:
        r = enqueue_bench.enqueue(args.host, sizes.enqueue_jobs, sizes.enqueue_rounds)
        return entry(r["library_jobs_per_s"], "jobs/s", r["bare_driver_jobs_per_s"],
                     "bare driver loop inserting the same rows", "ratio >= 0.8", r["ratio"] >= 0.8, r)

    def fire() -> dict[str, Any]:
        r = poller_bench.fire_throughput(args.host, sizes.fire_jobs, rounds=sizes.fire_rounds)
        return entry(r["poller_jobs_per_s"], "jobs/s", r["bare_loop_jobs_per_s"],
                     "bare driver read-and-record loop", "ratio >= 1.0 and >= 5,000 jobs/s", r["met"], r,
                     ratio=r["ratio"])

    def lateness() -> dict[str, Any]:
        r = poller_bench.lateness(args.host, 1000, sizes.lateness_s, series["lateness"],
                                  lead_s=5.0 if args.quick else 10.0)
        return entry(r["p99_ms"], "ms (p99)", 1000.0, "the 1 s poll interval", "p99 < 50 ms", r["met"], r)

    def async_handlers() -> dict[str, Any]:
        # Quick: the sync baseline (16 jobs/s, fixed by its concurrency) on 10 s of jobs, not 20.
        r = poller_bench.async_handlers(args.host, sync_n=160 if args.quick else 320)
        return entry(r["async_jobs_per_s"], "jobs/s (20,000 x asyncio.sleep(1), concurrency 5,000)",
                     r["sync_jobs_per_s"], "sync handlers (time.sleep(1)) at concurrency 16",
                     ">= 4,000 jobs/s, RSS < 300 MB", r["met"], r)

    def recurring() -> dict[str, Any]:
        r = recurring_bench.recurring(args.host, sizes.recurring_schedules, args.quick)
        return entry(r["recurring"]["cpu_ms_per_job"], "CPU ms per occurrence",
                     r["one_shot"]["cpu_ms_per_job"], "CPU ms per one-shot job (producer included)",
                     "p99 lateness < 1 s, cost <= 1.2x", r["met"], r, ratio=r["cost_ratio"])

    def storage() -> dict[str, Any]:
        r = storage_bench.storage_steady_state(args.host, *sizes.storage)
        return entry(r["end"]["rows_total"], "live rows at the end", r["first_steady"]["rows_total"],
                     "live rows at the first steady minute", r["goal"], r["met"], r,
                     ratio=r["ratios"]["rows"])

    def enqueue_async() -> dict[str, Any]:
        r = enqueue_async_bench.enqueue_async(args.host, sizes.enqueue_async_jobs, 1_000, 32, 2)
        return entry(r["async_jobs_per_s"], "jobs/s (AsyncClient.schedule from 1,000 tasks)",
                     r["schedule_many_jobs_per_s"], "Client.schedule_many of the same jobs",
                     "ratio >= 0.8", r["met"], r, ratio=r["ratio"])

    def api_enqueue() -> dict[str, Any]:
        r = api_enqueue_bench.api_enqueue(args.host, sizes.enqueue_jobs, sizes.enqueue_rounds)
        return entry(r["api_jobs_per_s"], f"jobs/s (POST /v1/jobs/batch of {r['batch']} jobs, {r['senders']} "
                     "connections, one API process)", r["schedule_many_jobs_per_s"],
                     "Client.schedule_many of as many jobs", "ratio >= 0.5", r["met"], r, ratio=r["ratio"])

    def due_now() -> dict[str, Any]:
        r = due_now_bench.lateness_due_now(args.host, 1000, sizes.due_now_s)
        return entry(r["fast_path"]["p99_ms"], "ms (p99, jobs due now, 1,000/s)",
                     r["without_nudges"]["p99_ms"], "the same run without nudges (now + late margin)",
                     "p99 < 500 ms", r["met"], r, ratio=r["ratio_p99"])

    def due_now_cli() -> dict[str, Any]:
        r = due_now_cli_bench.lateness_due_now_cli(args.host, sizes.due_now_cli_batches)
        return entry(r["cli"]["p99_ms"], "ms (p99 after the ack, `scheduler load` of 50 due-now jobs/s)",
                     r["client"]["p99_ms"], "the same batches from a long-lived Client",
                     "p99 < 500 ms", r["met"], r, ratio=r["ratio_p99"])

    step("enqueue", enqueue)
    step("enqueue_async", enqueue_async)
    step("api_enqueue", api_enqueue)
    step("lateness_due_now", due_now)
    step("lateness_due_now_cli", due_now_cli)
    step("fire_throughput", fire)
    step("lateness", lateness)
    step("async_handlers", async_handlers)
    step("recurring", recurring)
    step("storage_steady_state", storage)

    def audit_cost() -> dict[str, Any]:
        r = audit_bench.run(args.host, sizes.audit_jobs)
        return entry(r["audit_s"], f"s (audit of {r['jobs']:,} jobs)", r["plain_read_s"],
                     "bare-driver full read of the same partitions", "reported", None, r, ratio=r["ratio"])

    step("audit_cost", audit_cost)

    def rate_limit() -> dict[str, Any]:
        r = flow_bench.rate_limit_accuracy(args.host, args.zk, jobs=2000 if args.quick else 3000)
        return entry(r["observed_per_s"], f"starts/s (fleet of {r['pollers']}, {r['jobs']:,} due at once)",
                     r["limit_per_s"], "the kind's rate limit", r["goal"], r["met"], r, ratio=r["ratio"])

    def flow_overhead() -> dict[str, Any]:
        r = flow_bench.flow_control_overhead(args.host, jobs=12_000 if args.quick else 60_000,
                                             rounds=3 if args.quick else 6,
                                             lead_ms=flow_bench.QUICK_LOAD_LEAD_MS if args.quick
                                             else flow_bench.LOAD_LEAD_MS)
        return entry(r["limited_jobs_per_cpu_s"], "jobs/CPU-s (limits set that should not bind)",
                     r["unlimited_jobs_per_cpu_s"], "the same firing with no limits", r["goal"], r["met"], r,
                     ratio=r["ratio"])

    def key_fairness() -> dict[str, Any]:
        r = (flow_bench.key_fairness(args.host, big=2500, spread_s=5.0) if args.quick
             else flow_bench.key_fairness(args.host))
        return entry(r["p99_ms"], f"ms (p99 lateness of a small key beside a {r['big_key_jobs']:,}-job key)",
                     r["baseline_p99_ms"], "the same small-key jobs with no large key", r["goal"],
                     r["met"], r, ratio=r["ratio"])

    def flow_path() -> dict[str, Any]:  # the hot path alone: flow_control_overhead without the noise
        over = results.get("flow_control_overhead", {}).get("details", {}).get("unlimited_jobs_per_cpu_s")
        r = flowpath_bench.flow_path_cost(30_000 if args.quick else 60_000,
                                          poller_us_per_job=1e6 / over if over else None)
        return entry(r["limited_us_per_job"], "us of CPU per job in the poller's queues, limits set",
                     r["unlimited_us_per_job"], "the same with no limits", "reported", None, r)

    step("rate_limit_accuracy", rate_limit)
    step("flow_control_overhead", flow_overhead)
    step("flow_path_cost", flow_path)
    step("key_fairness", key_fairness)

    def http_targets() -> dict[str, Any]:
        r = http_bench.http_targets(args.host, jobs=sizes.http_jobs, seconds=sizes.http_lateness_s,
                                    lead_ms=http_bench.QUICK_LEAD_MS if args.quick else http_bench.LEAD_MS)
        return entry(r["deliveries_per_s"], "deliveries/s (one poller, a receiver answering in 50 ms)", None,
                     f"p99 lateness at 1,000/s: {r['p99_ms']} ms", r["goal"], r["met"], r)

    step("http_targets", http_targets)

    def tracing_overhead() -> dict[str, Any]:
        # On the embedded store: with no network round trip per write, the poller's own
        # per-job work (where tracing's hooks are) is the largest share of the time.
        r = tracing_bench.tracing_off_overhead("sqlite", rounds=2 if args.quick else 4)
        return entry(r["unconfigured_jobs_per_s"],
                     "jobs per CPU-second (embedded store, tracing present but unconfigured)",
                     r["disabled_jobs_per_s"], "the same firing with tracing disabled at import",
                     r["goal"], r["met"], r, ratio=r["ratio"])

    step("tracing_off_overhead", tracing_overhead)

    backlog_keys = {"poll_cost_backlog", "poller_rss_backlog", "peer_postgres", "cpu_per_job"}
    if not args.only or backlog_keys & args.only:
        backlog_steps(args, sizes, series, step, results)

    def scaling() -> dict[str, Any]:
        # Quick: jobs due 4 s plus 0.5 ms a job after the fleet settled (schedule_many writes
        # about 2,000 a second here; the 3 s late margin must be left when they are stored).
        r = fleet_bench.fleet_scaling(args.host, args.zk, sizes.fleet_jobs, tmp,
                                      lead_s=4 + sizes.fleet_jobs / 2000 if args.quick else None)
        series["fleet"] = {n: r[f"pollers_{n}_jobs_per_s"] for n in (1, 2, 4)}
        return entry(r["pollers_4_jobs_per_s"], "jobs/s", r["pollers_1_jobs_per_s"], "one poller",
                     "ratio >= 3.5", r["met"], r)

    def handover() -> dict[str, Any]:
        # Quick: done 5 s after the last job was due once the store has recorded every job
        # whose log line a kill -9 lost (the full run waits a minute more for them).
        r = fleet_bench.handover(args.host, args.zk, tmp, sizes.handover_s,
                                 done_after_s=5.0 if args.quick else None)
        return entry(r["kill_9_pause_s"], "s (kill -9 pause)", r["planned_leave_pause_s"],
                     "planned leave pause", "reported", None, r)

    def shards_moved() -> dict[str, Any]:
        r = fleet_bench.shards_moved()
        n4 = r["n4"]
        return entry(n4["join"], "shards moved (N=4 join, S=64)", n4["ideal_join"], "ideal S/(N+1)",
                     "about S/N", None, r)

    step("fleet_scaling", scaling)
    step("handover", handover)
    step("shards_moved", shards_moved)

    def fleetsim() -> dict[str, Any]:
        zk = zkmodel_bench.zkmodel(args.zk, 100, 16384)
        measured: dict[str, Any] = {}
        if "handover" in results:
            h = results["handover"]["details"]
            measured.update(planned_leave_pause_s=h["planned_leave_pause_s"],
                            kill_9_pause_s=h["kill_9_pause_s"])
        if "shards_moved" in results:
            n4 = results["shards_moved"]["details"]["n4"]
            measured.update(moves_n4_join=n4["join"], moves_n4_leave=n4["leave"])
        r = fleet_sim.fleetsim(1000, 16384, zk=zk, measured=measured or None, restarts=sizes.sim_restarts)
        return entry(r["moves_ratio_max"], "x ideal S/N (shards moved per join or leave, N=1,000, S=16,384)",
                     1.0, "the ideal S/N", "moves <= 1.1x and compute < 100 ms", r["met"],
                     {**r, "zkmodel": zk})

    step("fleetsim", fleetsim)

    def capacity_model() -> dict[str, Any]:
        inputs, measured = capacity.from_report({"results": results})
        r = capacity.check(inputs, measured)
        seed = capacity.plan(inputs, capacity.Target())
        return entry(r["max_abs_error"], "max |error| of the model's fleet throughput (1, 2, 4 pollers)",
                     None, "fleet_scaling's measured points", "reported", None,
                     {**r, "inputs": inputs.__dict__, "seed_002": seed})

    if "fleet_scaling" in results and "fire_throughput" in results:
        step("capacity_model_error", capacity_model)
    return results, series



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true",
                    help="smaller sizes: every benchmark in about 13 minutes on 2 cores")
    ap.add_argument("--out", default="bench/out", help="folder for report.md, report.json and plots")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--zk", default="127.0.0.1:2181")
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5433/bench")
    ap.add_argument("--only", type=lambda v: set(v.split(",")), default=set(),
                    help="run only these report keys, comma-separated (e.g. lateness_due_now)")
    args = ap.parse_args()
    sizes = QUICK if args.quick else FULL
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    report: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "quick": args.quick,
        "command": "ops/bench" + (" --quick" if args.quick else "") + f" --out {args.out}"
                   + (f" --only {','.join(sorted(args.only))}" if args.only else ""),
        "machine": machine_facts(), "versions": versions(args.host, args.zk, args.pg),
        "sizes": sizes.__dict__}
    results, series = run_all(args, sizes)
    report["results"] = results
    report["seconds"] = round(time.monotonic() - t0, 1)
    report["plots"] = plots(out, series)
    (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    (out / "report.md").write_text(markdown(report))
    print((out / "report.md").read_text())
    print(f"[bench] wrote {out}/report.md, report.json and {len(report['plots'])} plots "
          f"in {report['seconds']:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
