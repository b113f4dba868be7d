"""``scheduler demo``: the whole scheduler on one machine.

Schedules N jobs due over the next ~20 s across the shards, runs P pollers in this
process (the shards split between them), and checks every firing against what was
scheduled: fired, duplicates, early, lost, and lateness percentiles.

Its numbers are bounded (``check_demo``): the jobs are built in memory before anything
is printed, so an unbounded ``--jobs`` would only grow memory. SIGTERM stops it as
Ctrl-C does, removing the temporary store (``sigterm_stops``).
"""

from __future__ import annotations

import signal
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..domain.clock import SystemClock
from ..domain.dispatch import App
from ..domain.jobspec import JobSpec
from ..domain.keys import from_ms
from ..domain.model import Job
from ..errors import InvalidInput
from ..fleet.coord import LocalCoordinator
from ..poller import Poller, PollerConfig
from ..producer.client import Client
from ..store import SchemaOptions, Store, open_store
from .member import Fleet

# The first job is due this long after scheduling starts, beyond the late margin (jobs
# due sooner are moved to now + margin and would count as late).
LEAD_AFTER_MARGIN_S = 2.0
# Upper bounds of the demo's numbers: a demo, not a load test (ops/bench is that).
MAX_JOBS = 1_000_000
MAX_POLLERS = 64
MAX_SECONDS = 86_400.0
EXIT_TERMINATED = 143  # 128 + SIGTERM, as shells report it


def check_demo(jobs: int, pollers: int, seconds: float) -> None:
    """``InvalidInput`` (one line) unless 1 <= jobs <= ``MAX_JOBS``, 1 <= pollers <=
    ``MAX_POLLERS`` and 0 < seconds <= ``MAX_SECONDS``."""
    if not 1 <= jobs <= MAX_JOBS:
        raise InvalidInput(f"--jobs {jobs} must be between 1 and {MAX_JOBS:,}")
    if not 1 <= pollers <= MAX_POLLERS:
        raise InvalidInput(f"--pollers {pollers} must be between 1 and {MAX_POLLERS}")
    if not 0 < seconds <= MAX_SECONDS:  # nan fails both comparisons
        raise InvalidInput(f"--seconds {seconds:g} s must be more than 0 and at most "
                           f"{MAX_SECONDS:g} s (1 day)")


class Terminated(BaseException):
    """SIGTERM arrived: unwinds as KeyboardInterrupt does, so every ``finally`` runs
    (pollers stopped, the temporary store removed)."""


@contextmanager
def sigterm_stops() -> Iterator[None]:
    """Within the block, SIGTERM raises ``Terminated`` in the main thread (once: a
    second SIGTERM during the clean-up is ignored, so the clean-up finishes). Outside
    the main thread, where no handler can be set, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass(frozen=True)
class DemoSummary:
    scheduled: int
    fired: int
    duplicates: int
    early: int
    lost: int
    lateness_p50_ms: float
    lateness_p99_ms: float
    lateness_max_ms: float
    pollers: int
    shards: int
    store: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Tally:
    """What the demo handler saw, thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fired: dict[str, list[int]] = {}
        self.lateness_ms: list[float] = []
        self.early = 0
        self.per_shard: Counter[int] = Counter()

    def __call__(self, job: Job) -> None:
        now_ms = time.time_ns() / 1e6
        with self.lock:
            self.fired.setdefault(job.job_id, []).append(int(now_ms))
            self.per_shard[job.shard] += 1
            self.lateness_ms.append(now_ms - job.due_ms)
            if now_ms < job.due_ms:
                self.early += 1


def run_demo(jobs: int = 2000, pollers: int = 2, seconds: float = 20.0, store_url: str | None = None,
             shards: int = 16, on_tick: Callable[[dict[str, Any]], None] | None = None) -> DemoSummary:
    """Run the demo end to end; ``on_tick`` receives live progress about 4 times a second.
    Raises ``InvalidInput`` for numbers out of ``check_demo``'s bounds, before anything
    is created."""
    check_demo(jobs, pollers, seconds)
    tmp: tempfile.TemporaryDirectory[str] | None = None
    if store_url is None:
        tmp = tempfile.TemporaryDirectory(prefix="scheduler-demo-")
        store_url = f"sqlite:///{Path(tmp.name) / 'demo.db'}"
    clock = SystemClock()
    store: Store = open_store(store_url)
    try:
        store.apply_schema(SchemaOptions(shard_count=shards), clock.now_ms())
        total_shards = store.layouts().all_shards()
        client = Client(store, clock=clock)
        run_id = uuid.uuid4().hex[:6]
        lead_s = client.meta.late_margin_ms / 1000 + LEAD_AFTER_MARGIN_S
        start = from_ms(clock.now_ms()) + timedelta(seconds=lead_s)
        step = seconds / max(1, jobs)
        specs = [JobSpec(f"demo-{run_id}-{i}", start + timedelta(seconds=i * step), "demo", {"i": i})
                 for i in range(jobs)]
        scheduled = {j.job_id: j for j in client.schedule_many(specs)}
        tally = Tally()
        app = App.for_function(tally)
        config = PollerConfig(poll_interval_s=1.0, concurrency=8)
        # In-process coordination: the same fleet logic as with ZooKeeper (membership,
        # rendezvous assignment, shard locks), in a registry private to this run.
        fleet = [Fleet(Poller(store, app, clock=clock, config=config, name=f"demo-poller-{p}"),
                       LocalCoordinator(f"demo-{run_id}"), debounce_s=0.5)
                 for p in range(pollers)]
        t0 = time.monotonic()
        for member in fleet:
            member.start()
        deadline = t0 + lead_s + seconds + 30
        try:
            while time.monotonic() < deadline:
                with tally.lock:
                    done = len(tally.fired)
                    lat = list(tally.lateness_ms)
                    per_shard = dict(tally.per_shard)
                if on_tick:
                    on_tick({"scheduled": jobs, "fired": done, "per_shard": per_shard,
                             "shards": total_shards, "expected_per_shard": Counter(
                                 j.shard for j in scheduled.values()),
                             "lateness_p50_ms": percentile(lat, 0.5),
                             "lateness_p99_ms": percentile(lat, 0.99),
                             "elapsed_s": time.monotonic() - t0})
                if done >= jobs:
                    break
                time.sleep(0.25)
        finally:
            for member in fleet:
                member.stop()
        elapsed = time.monotonic() - t0
        fired = tally.fired
        lat = tally.lateness_ms
        return DemoSummary(
            scheduled=jobs,
            fired=len(fired),
            duplicates=sum(len(v) - 1 for v in fired.values()),
            early=tally.early,
            lost=sum(1 for job_id in scheduled if job_id not in fired),
            lateness_p50_ms=round(percentile(lat, 0.5), 1),
            lateness_p99_ms=round(percentile(lat, 0.99), 1),
            lateness_max_ms=round(max(lat, default=0.0), 1),
            pollers=pollers,
            shards=total_shards,
            store=store_url.split("?")[0] if tmp is None else "sqlite (temporary)",
            seconds=round(elapsed, 1),
        )
    finally:
        store.close()
        if tmp is not None:
            tmp.cleanup()
