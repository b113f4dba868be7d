"""``api_enqueue``: jobs/s scheduled through ``POST /v1/jobs/batch`` of a real ``scheduler
api`` process, against ``Client.schedule_many`` of as many jobs in this process (the
baseline: the fastest way to write them), in the same run.

    .venv/bin/python -m bench.api_enqueue [--jobs 20000] [--batch 500] [--senders 4]
                                          [--rounds 3] [--host 127.0.0.1 | --store URL] [--json]

The API process and this one share the machine (and, on a small one, its cores): the
figure is what one API process adds to a producer's cost, its HTTP, JSON and check of
existing ids included. Bodies are encoded before the clock starts; ``--senders``
connections send batches of ``--batch`` jobs at once. Rounds alternate the two sides,
and the best round of each is compared (noisy machines: best-of is the stable
statistic). Every job must come back 201. Goal: at least 0.5 of ``schedule_many``.
``--store sqlite:///PATH`` measures the embedded store (created if missing); without
it, a fresh Cassandra keyspace on ``--host``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from bench.common import drop, fresh_store, machine, report, timed
from scheduler import Client, JobSpec
from scheduler.domain.clock import SystemClock
from scheduler.store import SchemaOptions, Store, open_store

GOAL = 0.5
ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--store", help="sqlite:///PATH: the embedded store instead of Cassandra")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report({**api_enqueue(args.host, args.jobs, args.rounds, args.batch, args.senders, args.store),
            **machine()}, args.json)


def _jobs(prefix: str, jobs: int) -> list[dict[str, Any]]:
    """Jobs due from 10 minutes on: never within the late margin, whenever a round runs."""
    start = datetime.now(UTC) + timedelta(minutes=10)
    return [{"id": f"{prefix}-{i}", "at": (start + timedelta(milliseconds=i * 37)).isoformat(),
             "kind": "bench", "payload": {"i": i}} for i in range(jobs)]


class Served:
    """A ``scheduler api`` process on ``url``, with a producer token; stopped by ``close``."""

    def __init__(self, url: str, folder: Path) -> None:
        self.token = os.urandom(24).hex()
        tokens = folder / "tokens"
        tokens.write_text(f"producer {self.token}\n")
        self.base = f"http://127.0.0.1:{free_port()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
        env.update(SCHEDULER_API_TOKENS_FILE=str(tokens), SCHEDULER_STORE=url)
        self.log = folder / "api.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "scheduler", "api", "--address",
                                          self.base.removeprefix("http://")], cwd=ROOT, env=env,
                                         stdout=out, stderr=out)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"scheduler api exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.base}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("scheduler api did not answer within 60 s")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _send(served: Served, bodies: list[bytes], senders: int) -> None:
    """POST every body to /v1/jobs/batch over ``senders`` kept-alive connections; raises
    unless every job of every body answered 201."""
    headers = {"authorization": f"Bearer {served.token}", "content-type": "application/json"}
    clients = [httpx.Client(base_url=served.base, headers=headers, timeout=120) for _ in range(senders)]
    try:
        def post(i: int) -> None:
            body = bodies[i]
            r = clients[i % senders].post("/v1/jobs/batch", content=body)
            # Counted in the bytes: parsing every job back would load this process, not the API.
            expected = body.count(b'"id"')
            if r.status_code != 200 or r.content.count(b'"status":201') != expected:
                raise RuntimeError(f"batch {i}: {r.status_code} {r.text[:300]}")
        with ThreadPoolExecutor(senders) as pool:
            list(pool.map(post, range(len(bodies))))
    finally:
        for c in clients:
            c.close()


def api_enqueue(host: str, jobs: int, rounds: int, batch: int = 500, senders: int = 4,
                store_url: str | None = None) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="bench-api-"))
    store: Store
    if store_url:
        store = open_store(store_url)
        store.apply_schema(SchemaOptions(shard_count=16), SystemClock().now_ms())
    else:
        store = fresh_store(host, "bench_api")
    client = Client(store)
    served = Served(store.url, folder)
    best = {"api": float("inf"), "many": float("inf")}
    try:
        for r in range(rounds):
            many = [JobSpec(j["id"], datetime.fromisoformat(j["at"]), j["kind"], j["payload"])
                    for j in _jobs(f"many-{r}", jobs)]
            best["many"] = min(best["many"], timed(partial(client.schedule_many, many)))
            over_http = _jobs(f"api-{r}", jobs)
            bodies = [json.dumps({"jobs": over_http[i:i + batch]}).encode() for i in range(0, jobs, batch)]
            best["api"] = min(best["api"], timed(partial(_send, served, bodies, senders)))
        rate = {k: jobs / v for k, v in best.items()}
        ratio = rate["api"] / rate["many"]
        return {"benchmark": "api_enqueue", "store": "sqlite" if store_url else "cassandra",
                "jobs_per_round": jobs, "batch": batch, "senders": senders, "rounds": rounds,
                "api_jobs_per_s": round(rate["api"]), "schedule_many_jobs_per_s": round(rate["many"]),
                "ratio": round(ratio, 3), "goal": f">= {GOAL} of schedule_many", "met": ratio >= GOAL}
    finally:
        served.close()
        client.close()
        if not store_url:
            drop(store)  # type: ignore[arg-type]
        store.close()


if __name__ == "__main__":
    main()
