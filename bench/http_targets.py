"""``http_targets``: jobs of the built-in kind ``http`` delivered by one poller (an app
with no handler of its own: the built-in one on the poller's event loop) to a local
receiver that answers every request after 50 ms (``bench.receiver``, in a process of its
own, as a real receiver would be).

- **Deliveries per second**: ``--jobs`` jobs all due at the same instant; the count over
  the time from the first request's arrival at the receiver to the last's. Goal >=
  2,000/s.
- **Lateness at 1,000/s**: jobs due at a steady ``--rate`` for ``--seconds``; a job's
  lateness is its request's arrival at the receiver less its due time (so it includes
  the request's own sending, which a handler's start would not). Goal: p99 < 100 ms.

    .venv/bin/python -m bench.http_targets [--store sqlite|CASSANDRA_HOST] [--jobs 20000]
        [--concurrency 300] [--rate 1000] [--seconds 20] [--json]

The poller's ``--concurrency`` is 300: at 2,000 requests/s of 50 ms, about 100 are in
flight; more only opens more connections at once when a burst comes due.
"""

from __future__ import annotations

import argparse
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import machine, own_cpu_s, report
from bench.flow import new_store
from scheduler import App, Client, JobSpec
from scheduler.domain.keys import from_ms
from scheduler.domain.netguard import parse_allow
from scheduler.poller import Poller, PollerConfig
from scheduler.settings import Settings
from scheduler.store import Store

SHARDS = 16
DELAY_MS = 50
GOAL_PER_S = 2000.0
GOAL_P99_MS = 100.0
REPO = Path(__file__).resolve().parent.parent


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class ReceiverProcess:
    """``python -m bench.receiver`` answering after ``delay_ms``; ``stop`` returns the
    arrivals it recorded: job id -> arrival ms."""

    def __init__(self, delay_ms: float) -> None:
        self._dir = tempfile.mkdtemp(prefix="bench-receiver-")
        self.out = Path(self._dir) / "arrivals.txt"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.receiver", "--delay-ms", str(delay_ms), "--out", str(self.out)],
            cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"the receiver did not start: {line!r}")
        self.port = int(line.split()[-1])

    def stop(self) -> dict[str, int]:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        arrivals: dict[str, int] = {}
        for line in self.out.read_text().splitlines():
            job_id, _, ms = line.partition(" ")
            arrivals.setdefault(job_id, int(ms))  # the first attempt's
        return arrivals


def _deliver(where: str, due: dict[str, int], concurrency: int,
             label: str) -> tuple[dict[str, int], dict[str, Any]]:
    """Schedule ``due`` (job id -> due ms) as http jobs, run one poller until each has
    fired (or a time-out), return the arrivals and the poller's figures (its CPU time per
    job, the receiver's apart: it runs in a process of its own)."""
    receiver = ReceiverProcess(DELAY_MS)
    allow = parse_allow(f"127.0.0.1:{receiver.port}")
    url = f"http://127.0.0.1:{receiver.port}/hook"
    first = min(due.values())
    try:
        with new_store(where, f"bench_http_{label}", first - 60_000) as store:
            _schedule(store, allow, url, due)
            lead_s = (first - now_ms()) / 1000
            if lead_s < 3:
                raise RuntimeError(f"loading took too long: the first job is due in {lead_s:.1f} s")
            poller = Poller(store, App(), config=PollerConfig(concurrency=concurrency, http_allow=allow,
                                                              check_clock=False),
                            signing_secret=secrets.token_hex(32).encode())
            cpu0 = own_cpu_s()
            poller.start(range(SHARDS), epoch=1)
            try:
                end = time.monotonic() + (max(due.values()) - now_ms()) / 1000 + 120
                while poller.stats.fired + poller.stats.dead < len(due) and time.monotonic() < end:
                    time.sleep(0.1)
            finally:
                poller.stop()
            cpu_s = own_cpu_s() - cpu0
            stats = {"fired": poller.stats.fired, "dead": poller.stats.dead,
                     "poller_cpu_us_per_job": round(cpu_s * 1e6 / len(due))}
    finally:
        arrivals = receiver.stop()
    return arrivals, stats


def _schedule(store: Store, allow: Any, url: str, due: dict[str, int]) -> None:
    client = Client(store, settings=Settings(http_allow=allow, nudge=False))
    try:
        client.schedule_many(JobSpec(job_id, from_ms(ms), "http", {"url": url, "body": {"id": job_id}})
                             for job_id, ms in due.items())
    finally:
        client.close()


# The fixed part of the lead: 10 s for the keyspace and the poller's start; quick 4 s
# (the keyspace and the receiver take about 2 s here, and the poller needs 3 s more).
LEAD_MS, QUICK_LEAD_MS = 10_000, 4_000


def _lead_ms(jobs: int, fixed_ms: int = LEAD_MS) -> int:
    """Time to make the keyspace and load ``jobs`` before the first is due: on Cassandra
    ``schedule_many`` writes about 2,000 jobs/s here (the embedded store five times that),
    so 1 ms a job, plus ``fixed_ms`` for the keyspace and the poller's start."""
    return fixed_ms + jobs


def deliveries(where: str, jobs: int, concurrency: int, lead_ms: int = LEAD_MS) -> dict[str, Any]:
    at = now_ms() + _lead_ms(jobs, lead_ms)
    due = {f"d{i}": at for i in range(jobs)}
    arrivals, stats = _deliver(where, due, concurrency, "rate")
    times = sorted(arrivals[j] for j in due if j in arrivals)
    span_s = max(1e-3, (times[-1] - times[0]) / 1000) if times else 0.0
    return {"jobs": jobs, "delivered": len(times), **stats,
            "span_s": round(span_s, 2), "deliveries_per_s": round(len(times) / span_s, 1) if times else 0.0,
            "first_after_due_ms": times[0] - at if times else None}


def lateness(where: str, rate: int, seconds: int, concurrency: int, lead_ms: int = LEAD_MS) -> dict[str, Any]:
    start = now_ms() + _lead_ms(rate * seconds, lead_ms)
    n = rate * seconds
    due = {f"l{i}": start + i * 1000 // rate for i in range(n)}
    arrivals, stats = _deliver(where, due, concurrency, "late")
    late = sorted(arrivals[j] - ms for j, ms in due.items() if j in arrivals)
    if not late:
        return {"rate_per_s": rate, "seconds": seconds, "jobs": n, "delivered": 0}
    return {"rate_per_s": rate, "seconds": seconds, "jobs": n, "delivered": len(late), **stats,
            "early": sum(1 for v in late if v < 0), "p50_ms": late[len(late) // 2],
            "p99_ms": late[int(len(late) * 0.99)], "max_ms": late[-1]}


def http_targets(where: str, jobs: int = 20_000, concurrency: int = 300, rate: int = 1000,
                 seconds: int = 20, lead_ms: int = LEAD_MS) -> dict[str, Any]:
    """Both figures, and whether they meet the goals (every job delivered, too)."""
    throughput = deliveries(where, jobs, concurrency, lead_ms)
    late = lateness(where, rate, seconds, concurrency, lead_ms)
    met = (throughput["deliveries_per_s"] >= GOAL_PER_S and throughput["delivered"] == jobs
           and late.get("p99_ms", 1e9) < GOAL_P99_MS and late["delivered"] == late["jobs"])
    return {"benchmark": "http_targets", "store": "embedded" if where == "sqlite" else "cassandra",
            "receiver_delay_ms": DELAY_MS, "concurrency": concurrency, "deliveries": throughput,
            "lateness": late, "deliveries_per_s": throughput["deliveries_per_s"],
            "p99_ms": late.get("p99_ms"),
            "goal": f">= {GOAL_PER_S:,.0f} deliveries/s, p99 lateness < {GOAL_P99_MS:.0f} ms at {rate}/s",
            "met": met}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default="sqlite", help="sqlite (a temporary file) or a Cassandra host")
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=300)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report({**http_targets(args.store, args.jobs, args.concurrency, args.rate, args.seconds), **machine()},
           args.json)


if __name__ == "__main__":
    main()
