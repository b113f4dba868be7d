"""``lateness_due_now_cli``: jobs due now written by short-lived producers, one
``scheduler load`` process of 50 jobs a second (overlapping when a process takes longer
than a second, as a cron job's would), against the same batches from a long-lived
``Client`` (the baseline). One poller with 16 shards, in this process, with the due-now
fast path. Lateness is counted from the acknowledgement (the ``load`` process returned,
or ``schedule_many`` did), or from the due time when that is later; a job that fired
before its ``load`` process exited counts 0. ``from_due_*`` adds the process's start-up.

    .venv/bin/python -m bench.due_now_cli [--batches 20] [--host 127.0.0.1] [--json]

Goal: p99 within 500 ms of the acknowledgement, as for a long-lived client.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import drop, fresh_store, machine, report
from scheduler import App, Client, Job, JobSpec
from scheduler.poller import Poller, PollerConfig

SHARDS = 16
PER_BATCH = 50
GOAL_MS = 500.0
ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report({**lateness_due_now_cli(args.host, args.batches), **machine()}, args.json)


def _load(url: str, path: Path, b: int, acks: dict[int, float]) -> None:
    done = subprocess.run([sys.executable, "-m", "scheduler", "load", str(path)], cwd=ROOT,
                          env={**os.environ, "SCHEDULER_STORE": url}, capture_output=True,
                          text=True, check=False)
    acks[b] = time.time() * 1000 if done.returncode == 0 else -1.0


def _run(host: str, batches: int, cli: bool) -> dict[str, Any]:
    store = fresh_store(host, "bench_due_now_cli", SHARDS)
    fired: dict[str, float] = {}
    due: dict[str, int] = {}
    acks: dict[int, float] = {}
    lock = threading.Lock()

    def handler(job: Job) -> None:
        with lock:
            fired.setdefault(job.job_id, time.time() * 1000)

    poller = Poller(store, App.for_function(handler), config=PollerConfig(poll_interval_s=1.0))
    poller.start(range(SHARDS))
    deadline = time.monotonic() + 30
    while not store.notify_endpoints(int(time.time() * 1000)) and time.monotonic() < deadline:
        time.sleep(0.05)
    client = None if cli else Client(store)
    threads: list[threading.Thread] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for b in range(batches):
                now = datetime.now(UTC)
                ids = [f"b{b}-{i}" for i in range(PER_BATCH)]
                due.update({i: int(now.timestamp() * 1000) for i in ids})
                if client is None:
                    path = Path(tmp) / f"b{b}.jsonl"
                    lines = [json.dumps({"id": i, "at": now.isoformat(), "kind": "noop"}) for i in ids]
                    path.write_text("\n".join(lines) + "\n")
                    t = threading.Thread(target=_load, args=(store.url, path, b, acks))
                    t.start()
                    threads.append(t)
                else:
                    client.schedule_many([JobSpec(i, now, "noop") for i in ids])
                    acks[b] = time.time() * 1000
                time.sleep(1)
            for t in threads:
                t.join(120)
        wait_until = time.monotonic() + 30
        while len(fired) < len(due) and time.monotonic() < wait_until:
            time.sleep(0.1)
        nudged = poller.stats.nudged
    finally:
        poller.stop()
        if client is not None:
            client.close()
        drop(store)
        store.close()
    # A job often fires before its ``load`` process has exited: that counts as 0.
    acked = [j for j in fired if acks.get(_batch(j), -1) > 0]
    late = sorted(max(0.0, fired[j] - max(due[j], acks[_batch(j)])) for j in acked)
    from_due = sorted(fired[j] - due[j] for j in fired)
    return {"scheduled": len(due), "fired": len(fired), "nudged": nudged,
            "failed_loads": sum(1 for a in acks.values() if a < 0),
            **_quantiles("", late), **_quantiles("from_due_", from_due)}


def _batch(job_id: str) -> int:
    return int(job_id[1:].split("-")[0])


def _quantiles(prefix: str, xs: list[float]) -> dict[str, float | None]:
    n = len(xs)
    return {f"{prefix}p50_ms": round(xs[n // 2], 1) if n else None,
            f"{prefix}p99_ms": round(xs[int(n * 0.99)], 1) if n else None,
            f"{prefix}max_ms": round(xs[-1], 1) if n else None}


def lateness_due_now_cli(host: str, batches: int) -> dict[str, Any]:
    cli = _run(host, batches, cli=True)
    client = _run(host, batches, cli=False)
    met = (cli["p99_ms"] is not None and cli["p99_ms"] < GOAL_MS
           and cli["fired"] == cli["scheduled"] and cli["failed_loads"] == 0)
    ratio = (round(cli["p99_ms"] / client["p99_ms"], 3)
             if cli["p99_ms"] is not None and client["p99_ms"] else None)
    return {"benchmark": "lateness_due_now_cli", "batches": batches, "per_batch": PER_BATCH,
            "cli": cli, "client": client, "ratio_p99": ratio,
            "goal": f"p99 < {GOAL_MS:.0f} ms from the acknowledgement", "met": met}


if __name__ == "__main__":
    main()
