"""The producer's path on the 3-node cluster: short-lived producers (`scheduler load` and
`scheduler schedule`, each a fresh process) write jobs due now into a fresh RF 3
keyspace, overlapping, while two pollers under ZooKeeper fire them.

Fresh processes are the hard case: their first read pays for connecting and preparing,
and on a busy machine a write can be acknowledged later than the late margin allows, so
slow-write repair moves the job. Held here: nothing lost or early; duplicates within
the documented bound (each move adds at most one firing, and the retired old rows are
dropped by their owners); the due-now fast path taken (the pollers' nudge counts).
Timing is measured in ``ops/bench`` (``lateness_due_now_cli``), not here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.conftest import ZOOKEEPER_HOSTS
from tests.faultload import Pollers, measure, wait_fired
from tests.procs import ROOT

pytestmark = [pytest.mark.cluster3, pytest.mark.fault]
BATCHES, PER_BATCH = 12, 50
MOVED = re.compile(r"moved (\d+) jobs whose write was acknowledged late \((\d+) rounds?\)")


def cli(url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "scheduler", *args], cwd=ROOT, text=True,
                            env={**os.environ, "SCHEDULER_STORE": url},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def batch(path: Path, first: int) -> dict[str, int]:
    """A JSON-lines file of jobs due over the next 3 s; returns id -> due (epoch ms)."""
    now = datetime.now(UTC)
    due = {}
    with path.open("w") as fh:
        for i in range(PER_BATCH):
            at = now + timedelta(milliseconds=60 * i)
            job_id = f"trickle-{first + i}"
            due[job_id] = int(at.timestamp() * 1000)
            fh.write(json.dumps({"id": job_id, "at": at.isoformat(), "kind": "record"}) + "\n")
    return due


@pytest.mark.timeout(600)
def test_short_lived_producers_on_a_fresh_keyspace(cluster, cluster_keyspace, zookeeper_available, tmp_path):
    url = f"cassandra://{cluster}/{cluster_keyspace}"
    applied = subprocess.run([sys.executable, "-m", "scheduler", "schema", "apply", "--store", url,
                              "--replication", "simple:3"], cwd=ROOT, capture_output=True, text=True,
                             timeout=180, check=False)
    assert applied.returncode == 0, applied.stderr[-2000:]
    out = tmp_path / "fired.log"
    zk = f"zookeeper://{ZOOKEEPER_HOSTS}/producer-path-{time.time_ns()}"
    pollers = Pollers(url, out, "--coordinator", zk)
    due: dict[str, int] = {}
    procs: list[subprocess.Popen[str]] = []
    outputs: list[str] = []
    try:
        pollers.start(2)
        _wait_claimed(pollers)
        for b in range(BATCHES):  # one batch a second, overlapping as they will
            path = tmp_path / f"batch{b}.jsonl"
            due.update(batch(path, b * PER_BATCH))
            procs.append(cli(url, "load", str(path)))
            at = datetime.now(UTC)
            due[f"single-{b}"] = int(at.timestamp() * 1000)
            procs.append(cli(url, "schedule", "--id", f"single-{b}", "--at", at.isoformat(),
                             "--kind", "record"))
            time.sleep(1)
        for p in procs:
            _, stderr = p.communicate(timeout=180)
            assert p.returncode == 0, stderr[-2000:]
            outputs.append(stderr)
        records = wait_fired(out, due, 120, supervise=pollers)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        codes = pollers.stop()
    moves = [(int(n), int(r)) for text in outputs for n, r in MOVED.findall(text)]
    stopped = [ln for ln in pollers.log_lines() if ln.get("action") == "poller_stopped"]
    nudged = sum(int(ln.get("nudged", 0)) for ln in stopped)  # type: ignore[call-overload]
    dropped = sum(int(ln.get("retired_dropped", 0)) for ln in stopped)  # type: ignore[call-overload]
    report = measure("short-lived producers, fresh RF 3 keyspace", records, due,
                     window=(min(due.values()), max(due.values())))
    report.notes = {"moved_jobs": sum(n for n, _ in moves), "repair_rounds": [r for _, r in moves],
                    "nudged": nudged, "retired_dropped": dropped, "exit_codes": codes,
                    "crashes": len(pollers.crashes)}
    report.save()
    assert report.lost == 0 and report.early == 0, report
    # The documented bound: at most one extra firing per moved job.
    per_job = Counter(r.job_id for r in records)
    assert report.duplicates <= sum(n for n, _ in moves), report
    # A job moved in r rounds has r + 1 rows, each of which may fire once.
    assert max(per_job.values()) <= 1 + max((r for _, r in moves), default=0), report
    assert len(stopped) == 2 and not pollers.crashes, report
    # The fast path: jobs due now were taken by a nudge (a broken path takes none). Not
    # all of them: on a slow machine most writes are acknowledged late and moved, and an
    # old row that fired before its move was announced leaves the new one to the cursor
    # (one CI run: 558 of 612 jobs moved, 510 nudged; a quiet one: 612 of 612).
    assert nudged >= 0.5 * len(due), report


def _wait_claimed(pollers: Pollers, timeout: float = 60) -> None:
    """Until both pollers claimed their shards (the plan is published and applied)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        claims = {ln.get("poller") for ln in pollers.log_lines() if ln.get("action") == "shard_claimed"}
        if len(claims) >= 2:
            return
        pollers.supervise()
        time.sleep(0.2)
    raise AssertionError("the pollers did not claim their shards")
