"""Load and invariant checks for the fault tests (issue 12).

Load: a producer thread keeps scheduling jobs due within seconds while poller processes
fire them, on top of jobs loaded up front that are due all through the test (so a pause
in firing shows up as a gap). Invariant: every acknowledged job fires, none early,
duplicates within the documented bound. Every test appends its figures (lost, early,
duplicates, longest pause in firing, time to recover) to ``.data/fault-report.jsonl``;
``ops/test`` prints them at the end of the run.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from scheduler import Client, JobSpec
from scheduler.errors import SchedulerError
from tests.handlers import Record, read_records
from tests.procs import ROOT, start_poller

REPORT = ROOT / ".data" / "fault-report.jsonl"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Producer(threading.Thread):
    """Schedules one job every ``every_s``, due ``lead_s`` ahead. A failed call is
    retried with the same id and due time until it succeeds (the documented way to
    handle ``StoreUnavailable`` and ``WriteTimeout``); only then is it acknowledged."""

    def __init__(self, client: Client, prefix: str = "live", every_s: float = 0.2,
                 lead_s: tuple[float, float] = (3.0, 8.0)) -> None:
        super().__init__(name="producer", daemon=True)
        self.client, self.prefix, self.every_s, self.lead_s = client, prefix, every_s, lead_s
        self.acked: dict[str, int] = {}
        self.errors: list[tuple[int, str, str]] = []  # (ms, type, message)
        self.retried_ok = 0
        self._halt = threading.Event()

    def run(self) -> None:
        rnd = random.Random(7)
        i = 0
        while not self._halt.is_set():
            job_id = f"{self.prefix}{i}"
            due = datetime.now(UTC) + timedelta(seconds=rnd.uniform(*self.lead_s))
            failed = False
            while not self._halt.is_set():
                try:
                    job = self.client.schedule(job_id, due, "record")
                except SchedulerError as exc:
                    self.errors.append((now_ms(), type(exc).__name__, str(exc)))
                    failed = True
                    self._halt.wait(0.5)
                    continue
                self.acked[job_id] = job.due_ms
                self.retried_ok += failed
                break
            i += 1
            self._halt.wait(self.every_s)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)


def preload(client: Client, n: int, over_s: float, lead_s: float = 4.0,
            prefix: str = "pre") -> dict[str, int]:
    """``n`` jobs due evenly over ``over_s`` seconds from ``lead_s`` ahead."""
    start = datetime.now(UTC) + timedelta(seconds=lead_s)
    jobs = client.schedule_many([JobSpec(f"{prefix}{i}", start + timedelta(seconds=over_s * i / n), "record")
                                 for i in range(n)])
    return {j.job_id: j.due_ms for j in jobs}


class Pollers:
    """Poller processes under a test's supervision: one that exits 3 (its ZooKeeper
    session was lost) is started again, as a supervisor would; any other exit is a crash."""

    def __init__(self, url: str, out: Path, *args: str) -> None:
        self.url, self.out, self.args = url, out, args
        self.procs: list[subprocess.Popen[bytes]] = []
        self.restarts = 0
        self.crashes: list[int] = []
        self.extra: dict[int, tuple[str, tuple[str, ...]]] = {}

    def start(self, n: int = 1, *, url: str | None = None,
              extra: Sequence[str] = ()) -> list[subprocess.Popen[bytes]]:
        started = []
        for _ in range(n):
            p = start_poller(url or self.url, self.out, *self.args, *extra)
            self.extra[p.pid] = (url or self.url, tuple(extra))
            self.procs.append(p)
            started.append(p)
        return started

    def supervise(self) -> None:
        for i, p in enumerate(self.procs):
            rc = p.poll()
            if rc is None or p.pid in self.crashes:
                continue
            if rc == 3:
                self.restarts += 1
                url, extra = self.extra[p.pid]
                q = start_poller(url, self.out, *self.args, *extra)
                self.extra[q.pid] = (url, extra)
                self.procs[i] = q
            else:
                self.crashes.append(p.pid)

    def running(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self, timeout: float = 40) -> list[int | None]:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=timeout))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                codes.append(None)
        return codes

    def log_lines(self) -> list[dict[str, object]]:
        lines = []
        path = Path(f"{self.out}.log")
        if path.exists():
            for raw in path.read_text(errors="replace").splitlines():
                if raw.startswith("{"):
                    with contextlib.suppress(ValueError):
                        lines.append(json.loads(raw))
        return lines


def wait_fired(out: Path, due: dict[str, int], timeout: float, tick: float = 0.5,
               supervise: Pollers | None = None) -> list[Record]:
    """Wait until every job of ``due`` fired (or the timeout); returns all records."""
    end = time.monotonic() + timeout
    while True:
        if supervise is not None:
            supervise.supervise()
        records = read_records(str(out))
        if set(due) <= {r.job_id for r in records} or time.monotonic() > end:
            return records
        time.sleep(tick)


def duplicate_ids(records: list[Record]) -> set[str]:
    """Jobs fired more than once."""
    return {j for j, c in Counter(r.job_id for r in records).items() if c > 1}


@dataclass
class Report:
    fault: str
    jobs: int
    lost: int
    early: int
    duplicates: int
    longest_pause_s: float
    recovery_s: float | None
    notes: dict[str, object] = field(default_factory=dict)

    def save(self) -> None:
        REPORT.parent.mkdir(exist_ok=True)
        with REPORT.open("a") as fh:
            at = datetime.now(UTC).isoformat(timespec="seconds")
            fh.write(json.dumps({"at": at, **asdict(self)}) + "\n")


def measure(fault: str, records: list[Record], due: dict[str, int], *, window: tuple[int, int],
            recovered_at_ms: int | None = None) -> Report:
    """Figures for one run. ``window`` (epoch ms) is where jobs were due throughout:
    the longest pause is the longest gap between firings inside it. Recovery is the
    time from ``recovered_at_ms`` (the fault's end) to the first firing after it."""
    counts = Counter(r.job_id for r in records if r.job_id in due)
    lost = len(set(due) - set(counts))
    early = sum(1 for r in records if r.job_id in due and r.fired_ms < due[r.job_id])
    duplicates = sum(c - 1 for c in counts.values())
    fired = sorted(r.fired_ms for r in records if window[0] <= r.fired_ms <= window[1])
    edges = [window[0], *fired, window[1]] if fired else list(window)
    pause = max(b - a for a, b in itertools.pairwise(edges)) / 1000 if len(edges) > 1 else 0.0
    recovery = None
    if recovered_at_ms is not None:
        after = [f for f in fired if f >= recovered_at_ms]
        recovery = (after[0] - recovered_at_ms) / 1000 if after else None
    return Report(fault, len(due), lost, early, duplicates, round(pause, 2),
                  None if recovery is None else round(recovery, 2))


def env_with(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}


def worst_inversion(pairs: list[tuple[int, int]], together_ms: int) -> int:
    """The largest due-time inversion among ``(fired_ms, due_ms)`` pairs of one shard: how
    much older a job was than one that started more than ``together_ms`` before it (0 when
    they started oldest first). Jobs that started within ``together_ms`` of each other were
    handed out together and may start in any order."""
    ordered = sorted(pairs)
    worst, latest, j = 0, 0, 0
    for fired_ms, due_ms in ordered:
        while j < len(ordered) and ordered[j][0] < fired_ms - together_ms:
            latest = max(latest, ordered[j][1])
            j += 1
        worst = max(worst, latest - due_ms)
    return worst
