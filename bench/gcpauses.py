"""The garbage collector in a draining poller: CPython's default thresholds against the
ones ``scheduler run`` sets (``scheduler.runtime.gctune``).

Each round loads ``jobs`` overdue jobs (as ``fire_throughput`` does) and drains them with
one in-process poller, once under each setting, the order alternating. Reported per
setting, as medians over the rounds: jobs/s, CPU µs per fired job (this process), the
collector's own time (``gc.callbacks``), its longest pause, and the collections per
generation; the ratio is the per-round median of tuned over default jobs/s.

    .venv/bin/python -m bench.gcpauses [--jobs 200000] [--rounds 4] [--json]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any

from bench.common import drop, machine, own_cpu_s, report
from bench.fire import _fire_poller, overdue_store
from scheduler.domain.clock import SystemClock
from scheduler.runtime.gctune import POLLER_THRESHOLDS

DEFAULT_THRESHOLDS = (700, 10, 10)


class Pauses:
    """The collector's pauses, from ``gc.callbacks``, while installed."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._t0))

    def __enter__(self) -> Pauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def drain(host: str, jobs: int, thresholds: tuple[int, int, int]) -> dict[str, Any]:
    now = SystemClock().now_ms()
    store = overdue_store(host, jobs, now)
    saved = gc.get_threshold()
    try:
        gc.collect()  # the load's garbage is not this round's
        gc.set_threshold(*thresholds)
        cpu0 = own_cpu_s()
        with Pauses() as p:
            elapsed = _fire_poller(store, jobs, now)
        cpu = own_cpu_s() - cpu0
    finally:
        gc.set_threshold(*saved)
        drop(store)
        store.close()
    return {"jobs_per_s": jobs / elapsed, "cpu_us_per_job": cpu * 1e6 / jobs,
            "gc_s": sum(d for _, d in p.pauses),
            "longest_pause_ms": max((d for _, d in p.pauses), default=0) * 1000,
            "collections": [sum(1 for g, _ in p.pauses if g == gen) for gen in (0, 1, 2)]}


def gc_pauses(host: str, jobs: int = 200_000, rounds: int = 4) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"default": [], "poller": []}
    ratios = []
    for r in range(rounds):
        order = [("default", DEFAULT_THRESHOLDS), ("poller", POLLER_THRESHOLDS)]
        for name, thresholds in order if r % 2 == 0 else order[::-1]:
            runs[name].append(drain(host, jobs, thresholds))
        ratios.append(runs["poller"][-1]["jobs_per_s"] / runs["default"][-1]["jobs_per_s"])

    def median(name: str, key: str) -> float:
        return round(float(statistics.median(x[key] for x in runs[name])), 2)

    out: dict[str, Any] = {"jobs": jobs, "rounds": rounds, "thresholds": {"default": DEFAULT_THRESHOLDS,
                                                                          "poller": POLLER_THRESHOLDS}}
    for name in runs:
        out[name] = {key: median(name, key) for key in ("jobs_per_s", "cpu_us_per_job", "gc_s",
                                                         "longest_pause_ms")}
        out[name]["collections"] = [statistics.median(x["collections"][g] for x in runs[name])
                                    for g in range(3)]
    out["ratio"] = round(statistics.median(ratios), 3)
    out["ratio_spread"] = [round(min(ratios), 3), round(max(ratios), 3)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report({"machine": machine(), "gc_pauses": gc_pauses(args.host, args.jobs, args.rounds)}, args.json)


if __name__ == "__main__":
    main()
