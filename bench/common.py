"""Helpers shared by the benchmarks: a fresh keyspace, timing, machine facts."""

from __future__ import annotations

import gc
import json
import os
import platform
import re
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scheduler.domain.clock import SystemClock
from scheduler.store import SchemaOptions
from scheduler.store.cassandra.store import CassandraStore

OPS = Path(__file__).resolve().parent.parent / "ops"


def nodetool(*args: str) -> str:
    """``nodetool`` on the local node started by ``ops/cassandra``; raises on failure."""
    return subprocess.run([str(OPS / "cassandra"), "nodetool", *args], capture_output=True, text=True,
                          check=True, timeout=600).stdout


def settle(max_s: float = 120.0) -> float:
    """Wait until the local node has no compaction running or pending (the writes of an
    earlier benchmark otherwise load the next one's figures), at most ``max_s``; returns
    the seconds waited. Without a local node (nodetool fails) it waits 5 s."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < max_s:
        try:
            out = nodetool("compactionstats")
        except (OSError, subprocess.SubprocessError):
            time.sleep(5)
            break
        pending = re.search(r"pending tasks\s+(\d+)", out)
        if pending is not None and pending.group(1) == "0" and "compaction type" not in out.lower():
            break
        time.sleep(2)
    return round(time.monotonic() - t0, 1)


def fresh_store(host: str, prefix: str, shards: int = 16, now_ms: int | None = None) -> CassandraStore:
    """A new keyspace with the schema applied; ``now_ms`` sets its origin bucket."""
    keyspace = f"{prefix}_{uuid.uuid4().hex[:8]}"
    store = CassandraStore(f"cassandra://{host}/{keyspace}", concurrency=128)
    store.apply_schema(SchemaOptions(shard_count=shards),
                       SystemClock().now_ms() if now_ms is None else now_ms)
    return store


def write_bucket_rows(store: CassandraStore, jobs: list[Any], per_batch: int = 20) -> float:
    """Write only the jobs' bucket rows (the table a poll reads), in single-partition
    batches: the fast path for benchmark data. Returns rows/s."""
    from collections import defaultdict

    from cassandra.query import BatchStatement, BatchType

    from scheduler.store.cassandra.bind import bucket_params

    stmt = store.prepared("insert_bucket_row")
    t0 = time.perf_counter()
    groups: dict[tuple[int, int], list[Any]] = defaultdict(list)
    for job in jobs:
        groups[(job.bucket, job.shard)].append(job)
    batches: list[tuple[Any, None]] = []
    for group in groups.values():
        for i in range(0, len(group), per_batch):
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for job in group[i:i + per_batch]:
                batch.add(stmt, (*bucket_params(job), store.job_ttl(job)))
            batches.append((batch, None))
            if len(batches) >= 2000:
                store._concurrent(batches, "bench rows")
                batches = []
    store._concurrent(batches, "bench rows")
    return len(jobs) / max(1e-9, time.perf_counter() - t0)


def drop(store: CassandraStore) -> None:
    store.session.execute(f"DROP KEYSPACE IF EXISTS {store.keyspace}")


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def driver() -> dict[str, Any]:
    """The Cassandra driver's version and whether its Cython extensions are in use: without
    them the same version encodes requests and decodes rows in pure Python, on the same
    CPU the poller needs, so a throughput figure is read together with this."""
    import importlib

    import cassandra
    from cassandra import protocol
    from cassandra.cython_deps import HAVE_CYTHON

    # The modules on the fire path; each is compiled only when the wheel was built with
    # Cython (a .so next to its .py), and falls back to the .py silently otherwise.
    names = ("cluster", "connection", "protocol", "query", "concurrent", "cqltypes", "util")
    files = [str(getattr(importlib.import_module(f"cassandra.{n}"), "__file__", "")) for n in names]
    compiled = [f for f in files if f.endswith((".so", ".pyd"))]
    # What a session decodes rows with unless told otherwise (the store does not).
    handler = protocol.ProtocolHandler.__name__
    return {"version": cassandra.__version__, "compiled_modules": f"{len(compiled)}/{len(names)}",
            "compiled": len(compiled) == len(names),
            "cython_row_parser": bool(HAVE_CYTHON) and handler == "CythonProtocolHandler"}


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "cassandra_driver": driver(),
            "gc_thresholds": list(gc.get_threshold())}


def report(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in result.items():
            print(f"{key:>22}: {value}")


def server_cpu_s(comm: str, marker: str = "") -> float:
    """CPU seconds used so far by every process named ``comm`` whose command line holds
    ``marker`` (``java`` and ``CassandraDaemon`` for Cassandra, not ZooKeeper's java),
    each with its reaped children's time. (Postgres is read by ``tree_cpu_s`` from its
    postmaster: a host may run another one.) Linux only (``/proc``); raises
    ``RuntimeError`` when nothing matches. A difference of two readings is the server's
    share of the work between them, whatever else it did meanwhile included."""
    total, found = 0, False
    for entry in server_pids(comm, marker):
        try:
            total += _cpu_ticks(_stat_fields(entry.name))
        except OSError:  # gone meanwhile
            continue
        found = True
    if not found:  # a silent 0 would make a server's share vanish from a ratio
        raise RuntimeError(f"no process named {comm!r}" + (f" running {marker}" if marker else "")
                           + ": is the server running on this machine?")
    return total / os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int | str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command's closing parenthesis (so the
    state is [0], the parent's pid [1], and utime, stime, cutime, cstime [11:15])."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _cpu_ticks(fields: list[str]) -> int:
    """utime + stime + cutime + cstime, in clock ticks."""
    return sum(int(v) for v in fields[11:15])


def parent_pid(pid: int) -> int:
    return int(_stat_fields(pid)[1])


def tree_cpu_s(root: int) -> float:
    """CPU seconds of process ``root`` and of its live children, each with its reaped
    children's time: a Postgres server's whole work when ``root`` is its postmaster (a
    backend that exited is counted in the postmaster's children time, a live one in its
    own). Another server on the same host is not counted. Raises ``OSError`` when
    ``root`` is gone."""
    total = _cpu_ticks(_stat_fields(root))
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or entry.name == str(root):
            continue
        try:
            fields = _stat_fields(entry.name)
        except OSError:  # gone meanwhile: reaped, so in the root's children time
            continue
        if fields[1] == str(root):
            total += _cpu_ticks(fields)
    return total / os.sysconf("SC_CLK_TCK")


def server_pids(comm: str, marker: str = "") -> list[Path]:
    """The ``/proc`` folders of the processes named ``comm`` whose command line holds
    ``marker``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != comm:
                continue
            if marker and marker.encode() not in (entry / "cmdline").read_bytes():
                continue
        except OSError:
            continue
        out.append(entry)
    return out


def own_cpu_s() -> float:
    """CPU seconds of this process, every thread."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cassandra_cpu_s() -> float:
    return server_cpu_s("java", "CassandraDaemon")



def entry(value: float | None, unit: str, baseline: float | None, baseline_is: str, goal: str,
          met: bool | None, details: dict[str, Any], ratio: float | None = None) -> dict[str, Any]:
    if ratio is None and value is not None and baseline:
        ratio = value / baseline
    return {"value": value, "unit": unit, "baseline": baseline, "baseline_is": baseline_is,
            "ratio": None if ratio is None else round(ratio, 3), "goal": goal, "met": met,
            "details": details}

