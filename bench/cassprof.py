"""Where Cassandra's CPU goes while one poller drains a backlog: a Java Flight Recorder
profile of the local node (``jcmd``, in the JDK that runs it), taken around the same
drain as ``fire_throughput``'s poller side, summarised by thread pool and by the
Cassandra methods on the sampled stacks.

The recording perturbs what it measures (Cassandra's CPU per job rises under the
``profile`` settings), so read the shares, not the totals; the CPU per job printed
beside them is taken in a second drain without the recorder.

    .venv/bin/python -m bench.cassprof [--jobs 200000] [--top 25] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import drop, machine, report, server_pids, settle
from bench.fire import _fire_poller, _with_cpu, overdue_store
from scheduler.domain.clock import SystemClock

_POOL = re.compile(r"[-:\d\s]+$")  # "Native-Transport-Requests-12" -> "Native-Transport-Requests"


def summarise(events: list[dict[str, Any]], top: int) -> dict[str, Any]:
    """Shares of the samples by thread pool, and by Cassandra method anywhere on the
    stack (each method counted once per sample): what ``jfr print --json`` gives."""
    pools: Counter[str] = Counter()
    methods: Counter[str] = Counter()
    for e in events:
        values = e.get("values", {})
        thread = (values.get("sampledThread") or {}).get("javaName") or "?"
        pools[_POOL.sub("", thread) or thread] += 1
        seen = set()
        for frame in (values.get("stackTrace") or {}).get("frames") or []:
            method = frame.get("method") or {}
            name = f"{(method.get('type') or {}).get('name', '?')}.{method.get('name', '?')}"
            if "cassandra" in name and name not in seen:
                seen.add(name)
                methods[name.replace("/", ".").removeprefix("org.apache.cassandra.")] += 1
    n = max(1, len(events))
    return {"samples": len(events),
            "thread_pools": {k: round(v / n, 3) for k, v in pools.most_common(8)},
            "methods_inclusive": {k: round(v / n, 3) for k, v in methods.most_common(top)}}


def _drain(host: str, jobs: int) -> dict[str, float]:
    now = SystemClock().now_ms()
    store = overdue_store(host, jobs, now)
    try:
        settle(max_s=60)
        cpu: dict[str, tuple[float, float]] = {}
        seconds = _with_cpu(cpu, "drain", jobs, _fire_poller, store, jobs, now)
        poller_us, cassandra_us = cpu["drain"]
        return {"jobs_per_s": round(jobs / seconds), "poller_us_per_job": round(poller_us, 1),
                "cassandra_us_per_job": round(cassandra_us, 1)}
    finally:
        drop(store)
        store.close()


def cassprof(host: str, jobs: int, top: int) -> dict[str, Any]:
    pids = server_pids("java", "CassandraDaemon")
    if len(pids) != 1:
        raise SystemExit(f"needs exactly one local Cassandra node (found {len(pids)}): "
                         "start one with ops/cassandra start")
    pid = pids[0].name
    unprofiled = _drain(host, jobs)
    with tempfile.TemporaryDirectory(prefix="bench-jfr-") as tmp:
        path = Path(tmp) / "drain.jfr"
        subprocess.run(["jcmd", pid, "JFR.start", "name=bench", "settings=profile", f"filename={path}"],
                       check=True, capture_output=True)
        try:
            profiled = _drain(host, jobs)
        finally:
            subprocess.run(["jcmd", pid, "JFR.stop", "name=bench"], check=True, capture_output=True)
        text = subprocess.run(["jfr", "print", "--json", "--events", "jdk.ExecutionSample", str(path)],
                              check=True, capture_output=True, text=True).stdout
    events = json.loads(text)["recording"]["events"]
    return {"jobs": jobs, "unprofiled": unprofiled, "profiled": profiled, **summarise(events, top)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--jobs", type=int, default=200_000)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report({"machine": machine(), "cassprof": cassprof(args.host, args.jobs, args.top)}, args.json)


if __name__ == "__main__":
    main()
