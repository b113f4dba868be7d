"""Bounded storage: a steady load on Cassandra with a short retention, until storage
stops growing (``storage_steady_state``).

A producer schedules ``rate`` jobs/s, each due ``LEAD_S`` ahead, and cancels 1 % of them
(a cancel retires the row instead of deleting it); one poller fires the rest. The
keyspace's retention is short (2 minutes; quick: 10 s), so rows expire during the
run. At the first minute of steady state (retention + lead + one minute in) and at the
end, the same figures are taken; the goals compare the end with that first point:

- live rows in ``jobs_by_bucket`` and ``jobs`` (``SELECT COUNT(*)``): at most 1.2x;
- on-disk bytes of the two tables after ``nodetool flush`` and ``nodetool compact``
  (``Space used (live)``): at most 1.2x;
- poll cost: the median time of a caught-up poll of every shard (the reads a poller
  makes: from its cursor at "now" in the open bucket): at most 1.2x;
- tombstones scanned by those reads, from Cassandra's own tracing ("Read N live rows
  and M tombstone cells"): 0.

    .venv/bin/python -m bench.storage [--quick] [--json]
"""

from __future__ import annotations

import argparse
import re
import statistics
import threading
import time
from datetime import UTC, datetime
from typing import Any

from bench.common import drop, machine, nodetool, report
from scheduler import App, Client, JobSpec
from scheduler.domain.clock import SystemClock
from scheduler.domain.keys import bucket_of_ms
from scheduler.poller import Poller, PollerConfig
from scheduler.store import SchemaOptions
from scheduler.store.cassandra.store import CassandraStore

SHARDS = 16
LEAD_S = 5
# (jobs/s, retention s, minutes, first snapshot s). A row lives LEAD_S + retention, and
# its expired cells one retention more (gc_grace is the retention): from LEAD_S + 2 x
# retention on (25 s in quick), live rows and disk hold steady. Quick takes its first
# figures 5 s after that and its last at 90 s (a snapshot itself takes up to about 15 s:
# the last one comes at least 45 s after the first ends; a store that kept growing would
# have grown by half or more by then).
QUICK = (500, 10, 1.5, 30)
FULL = (1000, 120, 10, None)
TABLES = ("jobs_by_bucket", "jobs")
_TRACE = re.compile(r"Read (\d+) live rows and (\d+) tombstone cells")


def live_rows(store: CassandraStore) -> dict[str, int]:
    out = {}
    for table in TABLES:
        # A full scan, fine for a benchmark's ~100,000s of rows; never done by the scheduler.
        for attempt in range(4):
            try:
                rows = store.session.execute(f"SELECT COUNT(*) FROM {store.keyspace}.{table}", timeout=300)
                out[table] = int(rows.one()[0])
                break
            except Exception:  # a page timed out on a busy 2-core machine: count again
                if attempt == 3:
                    raise
                time.sleep(5)
    return out


def disk_bytes(store: CassandraStore) -> dict[str, int]:
    # Only the two measured tables: flushing the whole keyspace also flushed the paxos
    # state of the checkpoints table, and Cassandra 5.0.8 then failed every LWT on it
    # with "Unknown CF" (seen twice here, in the full-size run).
    nodetool("flush", store.keyspace, *TABLES)
    nodetool("compact", store.keyspace, *TABLES)
    out = {}
    for table in TABLES:
        text = nodetool("tablestats", f"{store.keyspace}.{table}")
        m = re.search(r"Space used \(live\): (\d+)", text)
        out[table] = int(m.group(1)) if m else -1
    return out


def poll_cost(store: CassandraStore, passes: int = 30) -> dict[str, Any]:
    """A caught-up poll of every shard, as a poller makes it: read the open bucket from
    a cursor at now up to 2 s ahead. Timed ``passes`` times; one traced pass."""
    stmt = store.prepared("select_bucket_rows")
    times = []
    for _ in range(passes):
        now = SystemClock().now_ms()
        bucket = bucket_of_ms(now, 60)
        t0 = time.perf_counter()
        store._concurrent([(stmt, (bucket, s, now, "", now + 2_000, 1000)) for s in range(SHARDS)], "poll")
        times.append((time.perf_counter() - t0) * 1000)
    live = tombstones = 0
    now = SystemClock().now_ms()
    for s in range(SHARDS):
        rs = store.session.execute(stmt, (bucket_of_ms(now, 60), s, now, "", now + 2_000, 1000), trace=True)
        for event in rs.get_query_trace(max_wait_sec=10).events:
            m = _TRACE.search(event.description or "")
            if m:
                live, tombstones = live + int(m.group(1)), tombstones + int(m.group(2))
    return {"poll_ms_median": round(statistics.median(times), 2), "traced_live_rows": live,
            "traced_tombstones": tombstones}


def snapshot(store: CassandraStore, t0: float) -> dict[str, Any]:
    snap = {"minute": round((time.time() - t0) / 60, 2), "rows": live_rows(store),
            "disk_bytes": disk_bytes(store), **poll_cost(store)}
    snap["rows_total"] = sum(snap["rows"].values())
    snap["disk_total"] = sum(snap["disk_bytes"].values())
    return snap


def storage_steady_state(host: str, rate: int, retention_s: int, minutes: float,
                         first_s: int | None = None) -> dict[str, Any]:
    """The figures at ``first_s`` (default: the first whole minute of steady state,
    retention + lead + a minute in) and at ``minutes``, and their ratios."""
    keyspace = f"bench_storage_{int(time.time())}"
    store = CassandraStore(f"cassandra://{host}/{keyspace}", concurrency=128)
    now = SystemClock().now_ms()
    store.apply_schema(SchemaOptions(shard_count=SHARDS, retention_s=retention_s), now - 120_000)
    client = Client(store)
    fired = [0]
    poller = Poller(store, App.for_function(lambda job: None), config=PollerConfig(concurrency=16))
    halt = threading.Event()
    counts = {"scheduled": 0, "cancelled": 0}

    def produce() -> None:
        t = time.time() + LEAD_S
        i = 0
        while not halt.is_set():
            n = rate // 2
            specs = [JobSpec(f"j{i + k}", datetime.fromtimestamp(t + k / rate, UTC), "tick", {"i": i + k})
                     for k in range(n)]
            client.schedule_many(specs)
            for k in range(0, n, 100):  # 1 %: a cancel in an open bucket
                client.cancel(f"j{i + k}")
                counts["cancelled"] += 1
            i, t = i + n, t + n / rate
            counts["scheduled"] = i
            halt.wait(max(0.0, t - LEAD_S - time.time()))

    snaps: list[dict[str, Any]] = []
    t0 = time.time()
    try:
        poller.start(range(SHARDS))
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        if first_s is None:
            first_s = (retention_s + LEAD_S) // 60 * 60 + 60 + 60
        for at in (first_s, minutes * 60):
            time.sleep(max(0.0, t0 + at - time.time()))
            snaps.append(snapshot(store, t0))
            print(f"[storage] {snaps[-1]}", flush=True)
        halt.set()
        producer.join(timeout=60)
        fired[0] = poller.stats.fired
        poller.stop()
    finally:
        client.close()
        drop(store)
        store.close()
    first, last = snaps
    ratios = {"rows": last["rows_total"] / max(1, first["rows_total"]),
              "disk": last["disk_total"] / max(1, first["disk_total"]),
              "poll": last["poll_ms_median"] / max(1e-9, first["poll_ms_median"])}
    met = (ratios["rows"] <= 1.2 and ratios["disk"] <= 1.2 and ratios["poll"] <= 1.2
           and first["traced_tombstones"] == 0 and last["traced_tombstones"] == 0)
    return {"rate_jobs_per_s": rate, "retention_s": retention_s, "minutes": minutes, "first_s": first_s,
            **counts,
            "fired": fired[0], "first_steady": first, "end": last,
            "ratios": {k: round(v, 3) for k, v in ratios.items()}, "met": met,
            "goal": "rows, disk and poll cost at the end <= 1.2x the first steady minute; 0 tombstones read"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rate, keep, minutes, first = QUICK if args.quick else FULL
    report({"machine": machine(), "quick": args.quick,
            "storage_steady_state": storage_steady_state(args.host, rate, keep, minutes, first)}, args.json)


if __name__ == "__main__":
    main()
