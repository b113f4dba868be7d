"""``tracing_off_overhead``: what the tracing code costs a poller when tracing is not
configured.

The fire throughput of a poller with the tracing code present but unconfigured
(OpenTelemetry installed and importable, no OTLP endpoint: the process sets tracing up as
``run_poller`` does, and it stays off), divided by the same in a process where tracing is
disabled at import (``SCHEDULER_TRACING=off``, and every import of ``opentelemetry``
refused by a meta-path finder installed before the scheduler is imported). Goal: >= 0.97.

Each side is one long-lived worker process (both warm, equal in everything but tracing),
each round on a fresh store of its own with ``jobs`` overdue no-op jobs. The parent
hands the sides rounds in turns, the order alternating (ABBA); the ratio is the median of
the rounds' ratios.

A round drives the poller's whole firing path in one thread, as its threads do (read the
shards, take the due jobs, run each chunk of 32 through the workers' ``fire_chunk``, where
the tracing hooks are, record the outcomes), and the throughput is jobs per second of that
thread's CPU time. One thread and its CPU time, because on a small shared machine the
wall-clock throughput of 20 threads moves by a third from one round to the next with
whatever else runs (measured: rounds of the same code from 0.71 to 1.35), far more than
the few per cent this is meant to see. ``--threads`` measures that way anyway: the
poller's threads running, jobs due at one instant, wall clock from it to the last one
recorded. The embedded stores' files go to /dev/shm (a tmpfs) where there is one: the
latency of a disk shared with other processes is not what is measured.

    .venv/bin/python -m bench.tracing [--store sqlite|cassandra] [--rounds 12] [--jobs 20000]
                                      [--threads] [--json]

The module imports nothing but the standard library at the top: a worker must be able to
block OpenTelemetry before anything of the scheduler is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parent.parent
SIDES = ("unconfigured", "disabled")
SHM = "/dev/shm"
GOAL = 0.97
CHUNK = 32  # the most due jobs a worker thread takes at once (workers.MAX_CHUNK)


class _NoOpenTelemetry:
    """A meta-path finder that refuses every ``opentelemetry`` module, as if the tracing
    extra were not installed."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by bench.tracing)", name=name)


# --- a worker ----------------------------------------------------------------------------------


def worker(side: str) -> None:
    """One side's process: set tracing up as a poller process does, then answer each
    request line on stdin (JSON) with one JSON line on stdout: ``load`` a fresh store,
    fire a ``slice`` of its jobs, or a ``threads`` round."""
    if side == "disabled":
        sys.meta_path.insert(0, _NoOpenTelemetry())
        os.environ["SCHEDULER_TRACING"] = "off"
    from scheduler.observe import tracing

    tracing.setup(process=True)
    assert not tracing.active(), "tracing is on: unset the OTEL_* variables for this benchmark"
    firing: _Inline | None = None
    for line in sys.stdin:
        ask = json.loads(line)
        if ask["op"] == "threads":
            result = _threads_round(ask["where"], int(ask["jobs"]))
        elif ask["op"] == "load":
            if firing is not None:
                firing.close()
            firing = _Inline(ask["where"], int(ask["jobs"]))
            result = {}
        else:
            assert firing is not None
            result = firing.slice(int(ask["jobs"]))
        result["opentelemetry_imported"] = any(m.startswith("opentelemetry") for m in sys.modules)
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
    if firing is not None:
        firing.close()


class _Inline:
    """A fresh store of ``n`` overdue no-op jobs and a poller (its threads not started)
    whose firing path this thread drives, a slice of jobs at a time."""

    def __init__(self, where: str, n: int) -> None:
        from bench.flow import SHARDS, job, load, new_store, now_ms
        from scheduler import App, Job
        from scheduler.poller import Poller, PollerConfig
        from scheduler.poller.workers import ThreadWorkers

        t = now_ms()
        self._opened = new_store(where, "bench_trace_off", t - 120_000)
        store = self._opened.__enter__()
        width = store.meta().bucket_width_s
        load(store, [job(width, f"t{i:06d}", "noop", t - 60_000 + i % 1000) for i in range(n)])
        self.poller = Poller(store, App.for_function(lambda job: None),
                             config=PollerConfig(read_limit=2000, max_buffered=max(50_000, 2 * n),
                                                 check_clock=False))
        workers = self.poller.workers
        assert isinstance(workers, ThreadWorkers)
        self.workers = workers
        for shard in range(SHARDS):
            self.poller.claim(shard)
        self.pending: list[Job] = []

    def slice(self, k: int) -> dict[str, Any]:
        """Fire the next ``k`` jobs (read, take the due ones, run each chunk of 32 through
        ``fire_chunk``, record the outcomes): this thread's CPU time for it."""
        poller, done = self.poller, 0
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        while done < k:
            if not self.pending:
                poller.poll_once()
                self.pending = poller.dispatch_ready()
                if not self.pending:
                    break  # nothing left
            take = min(k - done, len(self.pending), CHUNK)
            self.workers.fire_inline(self.pending[:take])
            del self.pending[:take]
            done += take
        poller.record_outcomes()
        return {"fired": done, "cpu_s": time.thread_time() - cpu0, "wall_s": time.perf_counter() - wall0}

    def close(self) -> None:
        self.poller.stop()
        self._opened.__exit__(None, None, None)


def _threads_round(where: str, n: int) -> dict[str, Any]:
    """``n`` no-op jobs all due at one instant, fired by the poller's threads (16 workers):
    jobs per second of wall time from that instant until the last outcome is recorded."""
    from bench.flow import SHARDS, job, load, new_store, now_ms
    from scheduler import App
    from scheduler.poller import Poller, PollerConfig

    lead_ms = 8_000 if where == "sqlite" else 15_000
    t = now_ms()
    with new_store(where, "bench_trace_off", t - 120_000) as store:
        width = store.meta().bucket_width_s
        due = t + lead_ms
        load(store, [job(width, f"t{i:06d}", "noop", due) for i in range(n)])
        if now_ms() > due - 2500:
            raise SystemExit(f"loading {n} jobs took more than {lead_ms / 1000 - 2.5:.1f} s: pass fewer")
        poller = Poller(store, App.for_function(lambda job: None),
                        config=PollerConfig(read_limit=2000, max_buffered=max(50_000, 2 * n)))
        for shard in range(SHARDS):
            poller.claim(shard)
        poller.start()
        try:
            while now_ms() < due:
                time.sleep(0.001)
            cpu0 = time.process_time()
            while poller.stats.fired < n and now_ms() < due + 600_000:
                time.sleep(0.002)
            cpu, fired = time.process_time() - cpu0, poller.stats.fired
            elapsed = (now_ms() - due) / 1000
        finally:
            poller.stop()
    return {"fired": fired, "jobs_per_s": fired / elapsed, "jobs_per_wall_s": fired / elapsed,
            "cpu_us_per_job": cpu / max(1, fired) * 1e6}


# --- the parent --------------------------------------------------------------------------------


def _start(side: str) -> subprocess.Popen[str]:
    """A worker process running as ``side``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "SCHEDULER_TRACING"}
    if os.path.isdir(SHM) and os.access(SHM, os.W_OK):
        env["TMPDIR"] = SHM  # the embedded stores' files in memory: see the module docstring
    return subprocess.Popen([sys.executable, "-m", "bench.tracing", "--worker", side], cwd=REPO, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _ask(proc: subprocess.Popen[str], **ask: Any) -> dict[str, Any]:
    stdin: IO[str] | None = proc.stdin
    stdout: IO[str] | None = proc.stdout
    assert stdin is not None and stdout is not None
    stdin.write(json.dumps(ask) + "\n")
    stdin.flush()
    line = stdout.readline()
    if not line:
        raise SystemExit(f"a worker ended (exit {proc.wait()}); its error is above")
    answer: dict[str, Any] = json.loads(line)
    return answer


def tracing_off_overhead(where: str = "sqlite", jobs: int = 40_000, rounds: int = 4, slice_jobs: int = 1000,
                         threads: bool = False, control: bool = False) -> dict[str, Any]:
    """Both sides in turns (see the module docstring); ``where`` is ``sqlite`` or a
    Cassandra host. Each of ``rounds`` rounds loads ``jobs`` jobs on each side and fires
    them ``slice_jobs`` at a time, the sides taking turns slice by slice (ABBA); with
    ``threads``, ``rounds`` rounds of ``jobs`` jobs each, the sides in turns. ``control``:
    the "disabled" side runs unconfigured too (an A/A run: what the method reads when
    there is no difference)."""
    procs = {side: _start("unconfigured" if control else side) for side in SIDES}
    pairs: list[dict[str, dict[str, Any]]] = []
    try:
        if threads:  # a warm-up round each, not counted
            for side in SIDES:
                _ask(procs[side], op="threads", where=where, jobs=min(jobs, 2000))
        for r in range(rounds):
            if threads:
                order = SIDES if r % 4 in (0, 3) else SIDES[::-1]
                pairs.append({side: _ask(procs[side], op="threads", where=where, jobs=jobs)
                              for side in order})
                u, d = (pairs[-1][s]["jobs_per_s"] for s in SIDES)
                print(f"  round {r + 1}/{rounds}: unconfigured {u:,.0f} jobs/s, disabled {d:,.0f} jobs/s, "
                      f"ratio {u / d:.3f}", file=sys.stderr)
                continue
            for side in SIDES:
                _ask(procs[side], op="load", where=where, jobs=jobs)
            got: list[dict[str, dict[str, Any]]] = []
            for i in range(jobs // slice_jobs):
                order = SIDES if i % 4 in (0, 3) else SIDES[::-1]
                got.append({side: _ask(procs[side], op="slice", jobs=slice_jobs) for side in order})
            # A slice's work is the same on both sides (the same jobs, read and recorded at
            # the same points); the warm-up is the first slices of the first round.
            pairs += got[2:] if r == 0 else got
            ratios = [g["disabled"]["cpu_s"] / g["unconfigured"]["cpu_s"] for g in got]
            print(f"  round {r + 1}/{rounds}: {len(got)} slices of {slice_jobs} jobs, median ratio "
                  f"{statistics.median(ratios):.3f} (slices {min(ratios):.2f}-{max(ratios):.2f})",
                  file=sys.stderr)
    finally:
        for proc in procs.values():
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in procs.values():
            proc.wait(timeout=120)
    if threads:
        rate = {s: [p[s]["jobs_per_s"] for p in pairs] for s in SIDES}
        fired = all(p[s]["fired"] == jobs for p in pairs for s in SIDES)
    else:
        rate = {s: [p[s]["fired"] / p[s]["cpu_s"] for p in pairs] for s in SIDES}
        fired = all(p[s]["fired"] == slice_jobs for p in pairs for s in SIDES)
    ratios = [u / d for u, d in zip(rate["unconfigured"], rate["disabled"], strict=True)]
    ratio = statistics.median(ratios)
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratio, ratio, ratio]
    return {"store": "sqlite" if where == "sqlite" else "cassandra", "jobs": jobs, "rounds": rounds,
            "control": control,
            "measured": ("the poller's threads, jobs due at one instant, wall clock" if threads else
                         f"the poller's firing path in one thread, per second of its CPU time, in slices "
                         f"of {slice_jobs} jobs"),
            "pairs": len(pairs),
            "unconfigured_jobs_per_s": round(statistics.median(rate["unconfigured"])),
            "disabled_jobs_per_s": round(statistics.median(rate["disabled"])),
            "ratio": round(ratio, 3), "ratio_is": "median of the paired slices' (rounds') ratios",
            "ratio_quartiles": [round(x, 3) for x in (q[0], q[2])],
            "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
            "opentelemetry_imported": {s: any(p[s]["opentelemetry_imported"] for p in pairs) for s in SIDES},
            "all_fired": fired, "goal": f">= {GOAL}", "met": fired and ratio >= GOAL}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--store", choices=["sqlite", "cassandra"], default="sqlite")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--rounds", type=int, default=4, help="rounds (a fresh store each)")
    ap.add_argument("--jobs", type=int, default=40_000, help="jobs per round and side")
    ap.add_argument("--threads", action="store_true",
                    help="the poller's threads and wall clock (noisy on a shared machine)")
    ap.add_argument("--control", action="store_true",
                    help="both sides unconfigured: an A/A run showing the method's noise")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    from bench.common import machine, report

    where = "sqlite" if args.store == "sqlite" else args.host
    print("running tracing_off_overhead ...", file=sys.stderr)
    result = tracing_off_overhead(where, args.jobs, args.rounds, threads=args.threads, control=args.control)
    report({"machine": machine(), "tracing_off_overhead": result}, args.json)


if __name__ == "__main__":
    main()
