"""The Postgres peer: the same workload on this scheduler (single-node Cassandra) and on
the single-table SKIP LOCKED design (``bench/peer.sql``), in one run.

Workload, for each system: ``far`` future jobs spread over the next 30 days, and
``near`` jobs due uniformly over a ``window_s`` window that opens once they are all
stored; then a no-op handler fires them. Then the same number again, all due at one
instant, to find each system's capacity (an offered rate both keep up with says
nothing about it). Reported per system: fire throughput (jobs / (last firing - window
start)), lateness p50/p99 (handler start minus due time) and the cost of one empty poll
with the far jobs stored.

The scheduler side is one in-process ``Poller`` (default settings, 1 s poll interval).
The peer side is ``workers`` threads, each with its own connection, claiming up to
``batch`` due rows per statement and sleeping one poll interval (1 s) when it finds none.
"""

from __future__ import annotations

import contextlib
import io
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import (
    cassandra_cpu_s,
    drop,
    fresh_store,
    own_cpu_s,
    parent_pid,
    settle,
    tree_cpu_s,
    write_bucket_rows,
)
from scheduler import App, Job
from scheduler.domain.clock import SystemClock
from scheduler.domain.keys import bucket_of_ms, shard_of
from scheduler.poller import Poller
from scheduler.store.cassandra.store import CassandraStore
from scheduler.store.queries import parse_named

SQL = parse_named((Path(__file__).parent / "peer.sql").read_text())
SHARDS = 16
FAR_SPAN_MS = 30 * 86_400_000


# The fixed part of each system's lead. Quick: the keyspace exists; the load and, on
# Postgres, the vacuum and checkpoint take 1-3 s here, and the firing side starts in 1 s.
LEAD_S, QUICK_LEAD_S = 10.0, 6.0


def _lead_s(near: int, floor_rows_per_s: int, fixed_s: float = LEAD_S) -> float:
    # Each system stores the near jobs before their window opens (at a rate safely below
    # what its bulk path reaches here), so no job is due before the firing side starts.
    return fixed_s + near / floor_rows_per_s


def lead_ms(near: int, fixed_s: float = LEAD_S) -> int:
    """The scheduler side's wait before its jobs fall due: time to store them first."""
    return int(_lead_s(near, 12_000, fixed_s) * 1000)


def summary(name: str, lateness_ms: list[float], window_start_ms: int, fired_at_ms: list[int],
             poll_ms: float, near: int) -> dict[str, Any]:
    lateness_ms.sort()
    fired = len(lateness_ms)
    span_s = max(0.001, (max(fired_at_ms, default=window_start_ms) - window_start_ms) / 1000)
    return {"system": name, "fired": fired, "expected": near,
            "fire_jobs_per_s": round(fired / span_s),
            "lateness_p50_ms": round(lateness_ms[fired // 2], 1) if fired else None,
            "lateness_p99_ms": round(lateness_ms[int(fired * 0.99)], 1) if fired else None,
            "lateness_max_ms": round(lateness_ms[-1], 1) if fired else None,
            "empty_poll_ms": round(poll_ms, 3)}


class Cpu:
    """CPU seconds of the client (this process by default: the poller, or the peer's
    workers) and of the server, from 3 s before the first job falls due (the scheduler
    reads 2 s ahead) to the end of the firing, its last outcomes recorded; the idle wait
    before is not the work measured."""

    def __init__(self, server: Callable[[], float], start_ms: int,
                 client: Callable[[], float] = own_cpu_s) -> None:
        time.sleep(max(0.0, start_ms / 1000 - 3 - time.time()))
        self.server, self.client = server, client
        self.own0, self.server0 = client(), server()

    def used(self) -> dict[str, float]:
        own, server = self.client() - self.own0, self.server() - self.server0
        return {"client_cpu_s": round(own, 2), "server_cpu_s": round(server, 2),
                "cpu_s": round(own + server, 2)}


# --- this scheduler ----------------------------------------------------------------------


def run_scheduler(store: CassandraStore, near: int, window_s: float,
                  samples_out: list[float] | None = None, prefix: str = "near",
                  lead_s: float = LEAD_S) -> dict[str, Any]:
    """Fire ``near`` jobs on ``store`` (which already holds the far backlog). The jobs
    are written like the far ones, bucket rows only (the producer path is measured by
    the ``enqueue`` benchmark)."""
    now = SystemClock().now_ms()
    start = now + lead_ms(near, lead_s)
    jobs = []
    for i in range(near):
        due = start + int(i * window_s * 1000 / near)
        job_id = f"{prefix}-{i}"
        jobs.append(Job(job_id=job_id, kind="noop", data=b"{}", data_json=True, due_ms=due, fire_ms=due,
                        bucket=bucket_of_ms(due, 60), shard=shard_of(job_id, SHARDS)))
    write_bucket_rows(store, jobs)
    del jobs
    late: list[float] = []
    fired_at: list[int] = []
    lock = threading.Lock()

    def handler(job: Job) -> None:
        t = time.time() * 1000
        with lock:
            late.append(t - job.due_ms)
            fired_at.append(int(t))

    poller = Poller(store, App.for_function(handler))
    poller.start(range(SHARDS))
    cpu = Cpu(cassandra_cpu_s, start)
    deadline = time.monotonic() + (start - now) / 1000 + window_s + 300
    while len(late) < near and time.monotonic() < deadline:
        time.sleep(0.2)
    poller.stop()  # writes what is left to record: part of the work
    used = cpu.used()
    poll_ms = _empty_poll_cassandra(store)
    if samples_out is not None:
        samples_out.extend(late)
    return {**summary("scheduler (Cassandra)", late, start, fired_at, poll_ms, near), **used}


def _empty_poll_cassandra(store: CassandraStore, rounds: int = 100) -> float:
    """A poll with nothing due: every shard's next bucket (the current one holds the fired
    near jobs, which a real poller's cursor has passed and never reads again)."""
    times = []
    for _ in range(rounds):
        now = SystemClock().now_ms()
        bucket = bucket_of_ms(now, 60) + 60
        t0 = time.perf_counter()
        for shard in range(SHARDS):
            store.read_bucket(bucket, shard, None, now + 2000, 1000)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


# --- the Postgres peer -----------------------------------------------------------------


def _copy(conn: Any, rows: Callable[[], Any], n: int) -> None:
    with conn.cursor() as cur, cur.copy(SQL["copy_jobs"]) as copy:
        buf = io.StringIO()
        for i, line in enumerate(rows()):
            buf.write(line)
            if i % 50_000 == 49_999:
                copy.write(buf.getvalue())
                buf = io.StringIO()
        copy.write(buf.getvalue())


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}+00"


def load_postgres(url: str, far: int) -> float:
    """A fresh table with ``far`` future jobs and the partial index; returns rows/s."""
    import psycopg

    now = SystemClock().now_ms() + 3_600_000
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SQL["drop_table"])
        conn.execute(SQL["create_table"])
        t0 = time.perf_counter()
        _copy(conn, lambda: (f"far-{i}\tbacklog\t{{}}\t{_iso(now + i * FAR_SPAN_MS // far)}\n"
                             for i in range(far)), far)
        conn.execute(SQL["create_index"])  # after the bulk load, as anyone loading 10M rows would
        conn.execute(SQL["analyze"])
        return far / (time.perf_counter() - t0)


def run_postgres(url: str, near: int, window_s: float, workers: int = 4, batch: int = 100,
                 poll_interval_s: float = 1.0, samples_out: list[float] | None = None,
                 prefix: str = "near", lead_s: float = LEAD_S) -> dict[str, Any]:
    import psycopg

    now = SystemClock().now_ms()
    start = now + int(_lead_s(near, 50_000, lead_s) * 1000)
    with psycopg.connect(url, autocommit=True) as conn:
        _copy(conn, lambda: (f"{prefix}-{i}\tnoop\t{{}}\t{_iso(start + int(i * window_s * 1000 / near))}\n"
                             for i in range(near)), near)
        conn.execute(SQL["analyze"])
        postmaster = parent_pid(_backend_pid(conn))
    _quiet_postgres(url)  # the load's vacuum and dirty pages are not the firing's work
    late: list[float] = []
    fired_at: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()
    backends: list[int] = []

    def worker() -> None:
        with psycopg.connect(url, autocommit=True) as c:
            backends.append(_backend_pid(c))
            while not stop.is_set():
                rows = c.execute(SQL["claim"], (batch,)).fetchall()
                if not rows:
                    stop.wait(poll_interval_s)
                    continue
                done = []
                for job_id, _kind, _payload, due_ms in rows:
                    t = time.time() * 1000  # the no-op handler starts here
                    with lock:
                        late.append(t - due_ms)
                        fired_at.append(int(t))
                    done.append(job_id)
                c.execute(SQL["complete"], (done,))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
        time.sleep(poll_interval_s / workers)  # staggered: together they poll `workers` times a second
    cpu = Cpu(lambda: tree_cpu_s(postmaster), start)
    deadline = time.monotonic() + (start - now) / 1000 + window_s + 300
    while len(late) < near and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    if any(t.is_alive() for t in threads):
        raise RuntimeError("a Postgres worker did not stop within 30 s: its CPU cannot be read")
    # The workers' backends exit as their connections close; read once they are reaped
    # (their time then sits in the postmaster's children time), not while one may be
    # reaped between the postmaster's reading and its own.
    _wait_reaped(backends)
    used = cpu.used()
    with psycopg.connect(url, autocommit=True) as conn:
        poll_ms = _empty_poll_postgres(conn, batch)
    if samples_out is not None:
        samples_out.extend(late)
    return {**summary("Postgres SKIP LOCKED", late, start, fired_at, poll_ms, near), **used}


def _backend_pid(conn: Any) -> int:
    """The server process serving ``conn`` (its parent is the postmaster)."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    return int(row[0])


def _wait_reaped(pids: list[int], timeout_s: float = 10.0) -> None:
    """Until none of ``pids`` is left in ``/proc`` (reaped by its parent); raises after
    ``timeout_s``: a reading taken then would miss a backend's time."""
    end = time.monotonic() + timeout_s
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        if time.monotonic() > end:
            raise RuntimeError(f"Postgres backends {pids} still there {timeout_s:.0f} s after their "
                               "connections closed: their CPU cannot be read")
        time.sleep(0.05)


def _quiet_postgres(url: str) -> None:
    """Vacuum the peer's table and checkpoint now, so neither runs in the next measured
    window. ``CHECKPOINT`` needs a superuser (or ``pg_checkpoint``): refused, it is
    skipped, and the dirty pages may be written during the window."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SQL["vacuum"])
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute("CHECKPOINT")


def _empty_poll_postgres(conn: Any, batch: int, rounds: int = 100) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        conn.execute(SQL["claim"], (batch,)).fetchall()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def peer_postgres(host: str, pg_url: str, far: int, near: int, window_s: float,
                  store_with_backlog: CassandraStore | None = None,
                  load_backlog: Callable[[CassandraStore, int], float] | None = None,
                  samples: dict[str, list[float]] | None = None, lead_s: float = LEAD_S) -> dict[str, Any]:
    """Both systems, one after the other, each with ``far`` stored and ``near`` to fire,
    due ``lead_s`` (plus the time to store them) after each run starts."""
    own = store_with_backlog is None
    samples = {} if samples is None else samples
    store = store_with_backlog or fresh_store(host, "bench_peer", SHARDS,
                                              now_ms=SystemClock().now_ms() - 120_000)
    try:
        if own and load_backlog is not None:
            load_backlog(store, far)
        ours = run_scheduler(store, near, window_s, samples.setdefault("ours", []), lead_s=lead_s)
        settle()  # the drain's CPU is measured: the first run's compactions are not its work
        ours_drain = run_scheduler(store, near, 0.0, prefix="drain", lead_s=lead_s)
    finally:
        if own:
            drop(store)
            store.close()
    pg_load = load_postgres(pg_url, far)
    peer = run_postgres(pg_url, near, window_s, samples_out=samples.setdefault("postgres", []), lead_s=lead_s)
    peer_drain = run_postgres(pg_url, near, 0.0, prefix="drain", lead_s=lead_s)
    return {"far_jobs": far, "near_jobs": near, "window_s": window_s,
            "offered_jobs_per_s": round(near / window_s), "postgres_load_rows_per_s": round(pg_load),
            "scheduler": ours, "postgres": peer, "scheduler_drain": ours_drain, "postgres_drain": peer_drain}
