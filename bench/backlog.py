"""The ``ops/bench`` steps that need the far-future backlog, loaded once and dropped
after: poll cost and RSS with the backlog stored, the Postgres peer over the same
workload, and the CPU per fired job of the peer's two drains."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import peer as peer_bench
from bench import peerprocs
from bench import poller as poller_bench
from bench.common import drop, entry, fresh_store

SHARDS = poller_bench.SHARDS

def backlog_steps(args: argparse.Namespace, sizes: Any, series: dict[str, Any],
                  step: Callable[..., None], results: dict[str, Any]) -> None:
    """The steps that need the far-future backlog (loaded once, dropped after)."""
    # One store holds the far-future backlog for poll cost, RSS and the peer's far set.
    empty = fresh_store(args.host, "bench_empty", SHARDS)
    full = fresh_store(args.host, "bench_backlog", SHARDS)
    print(f"[bench] loading {sizes.backlog:,} far-future jobs ...", file=sys.stderr, flush=True)
    load_rate = poller_bench.load_backlog(full, sizes.backlog)
    try:
        def poll_cost() -> dict[str, Any]:
            r = poller_bench.poll_cost(empty, full, 200)
            return entry(r["poll_ms_with_backlog"], "ms per poll of 16 shards", r["poll_ms_empty_store"],
                         "the same poll with nothing stored", "ratio <= 1.2", r["met"],
                         {**r, "backlog": sizes.backlog, "backlog_load_rows_per_s": round(load_rate)})

        def rss() -> dict[str, Any]:
            r = poller_bench.rss(empty.url, full.url, sizes.rss_s)
            return entry(r["rss_mb_with_backlog"], "MB", r["rss_mb_empty_store"],
                         "the same poller with nothing stored", "< 200 MB", r["met"],
                         {**r, "backlog": sizes.backlog})

        def peer() -> dict[str, Any]:
            lead_s = peer_bench.QUICK_LEAD_S if args.quick else peer_bench.LEAD_S
            r = peer_bench.peer_postgres(args.host, args.pg, sizes.backlog, sizes.peer_near,
                                         sizes.peer_window_s, store_with_backlog=full,
                                         samples=series["peer"], lead_s=lead_s)
            ours, pg = r["scheduler_drain"], r["postgres_drain"]
            r["one_process_ratio"] = round(ours["fire_jobs_per_s"] / max(1, pg["fire_jobs_per_s"]), 3)
            # The key: one poller process per core (`scheduler run --processes 2`), as a
            # user runs it on this machine, against the peer's drain in paired rounds.
            with tempfile.TemporaryDirectory(prefix="bench-peer-") as tmp:
                pair = peerprocs.paired_drains(full, args.zk, args.pg, sizes.peer_near, lead_s,
                                               sizes.peer_rounds, Path(tmp))
            r["processes"] = pair
            return entry(pair["scheduler_jobs_per_s"],
                         "jobs/s (capacity: a backlog due at once; `scheduler run --processes 2`)",
                         pair["postgres_jobs_per_s"], "the Postgres SKIP LOCKED design, same workload",
                         "ratio >= 1.2", pair["ratio"] >= 1.2, r, ratio=pair["ratio"])

        def cpu_per_job() -> dict[str, Any]:  # from peer_postgres's two drains: no run of its own
            d = results["peer_postgres"]["details"]
            ours, pg = d["scheduler_drain"], d["postgres_drain"]
            mine = ours["cpu_s"] / max(1, ours["fired"]) * 1e6
            theirs = pg["cpu_s"] / max(1, pg["fired"]) * 1e6
            ratio = mine / theirs if theirs else None
            return entry(round(mine, 1), "us of CPU per fired job (poller + Cassandra, draining a backlog)",
                         round(theirs, 1), "the Postgres peer's workers + Postgres, same drain",
                         "ratio <= 0.8", ratio is not None and ratio <= 0.8,
                         {"scheduler": {k: ours[k] for k in ("client_cpu_s", "server_cpu_s", "fired")},
                          "postgres": {k: pg[k] for k in ("client_cpu_s", "server_cpu_s", "fired")}},
                         ratio=ratio)

        step("poll_cost_backlog", poll_cost)
        step("poller_rss_backlog", rss)
        step("peer_postgres", peer, "cpu_per_job" in args.only)
        if "peer_postgres" in results and (not args.only or "cpu_per_job" in args.only):
            results["cpu_per_job"] = cpu_per_job()  # arithmetic on the peer's figures: no settle, no run
    finally:
        for st in (empty, full):
            drop(st)
            st.close()

