"""The page for a dead poller, end to end, with a real Prometheus (Debian's, installed by
ops/setup with promtool) loading ops/prometheus/alerts.yml and scraping two pollers on
fixed shards and the exporter every 2 s. One poller is killed with -9 while jobs keep
falling due: SchedulerShardJobsOverdue fires within 2 minutes for exactly its shards,
and no alert fires for the healthy poller's shards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scheduler import Client
from scheduler.domain.clock import SystemClock
from scheduler.store import SchemaOptions, open_store
from tests.conftest import cassandra_url
from tests.procs import ROOT, free_port, kill_all, start_poller, wait_until

PAGE_WITHIN_S = 120


def api(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/{path}", timeout=5) as resp:
        return json.loads(resp.read())["data"]


def firing(port: int) -> list[dict[str, str]]:
    return [a["labels"] for a in api(port, "alerts")["alerts"] if a["state"] == "firing"]


def test_a_dead_poller_pages_within_2_minutes_and_only_for_its_shards(cassandra_keyspace, prometheus,
                                                                       tmp_path: Path) -> None:
    url = cassandra_url(cassandra_keyspace)
    store = open_store(url)
    store.apply_schema(SchemaOptions(shard_count=4, bucket_width_s=10), SystemClock().now_ms())
    ports = {"a": free_port(), "b": free_port(), "exporter": free_port(), "prom": free_port()}
    out = tmp_path / "fired.log"
    procs = [start_poller(url, out, "--shards", spec,
                          env={"SCHEDULER_METRICS_ADDRESS": f"127.0.0.1:{ports[k]}"})
             for k, spec in (("a", "0-1"), ("b", "2-3"))]
    env = {**os.environ, "SCHEDULER_STORE": url}
    with open(tmp_path / "exporter.log", "wb") as log:
        procs.append(subprocess.Popen([sys.executable, "-m", "scheduler", "exporter", "--address",
                                       f"127.0.0.1:{ports['exporter']}", "--interval", "2"], cwd=ROOT,
                                      env=env, stdout=subprocess.DEVNULL, stderr=log))
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""
global: {{scrape_interval: 2s, evaluation_interval: 2s}}
rule_files: ["{ROOT / 'ops' / 'prometheus' / 'alerts.yml'}"]
scrape_configs:
  - job_name: scheduler-exporter
    static_configs: [{{targets: ["127.0.0.1:{ports['exporter']}"]}}]
  - job_name: scheduler-poller
    static_configs: [{{targets: ["127.0.0.1:{ports['a']}", "127.0.0.1:{ports['b']}"]}}]
""")
    with open(tmp_path / "prometheus.log", "wb") as log:
        procs.append(subprocess.Popen([prometheus, f"--config.file={config}",
                                       f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                       f"--web.listen-address=127.0.0.1:{ports['prom']}"],
                                      stdout=subprocess.DEVNULL, stderr=log))
    client = Client(store)
    halt = threading.Event()

    def produce() -> None:  # jobs fall due on every shard, several a second
        while not halt.is_set():
            client.schedule_many([{"id": f"j-{uuid.uuid4().hex[:12]}", "at": datetime.now(UTC),
                                   "kind": "record"} for _ in range(8)])
            halt.wait(1.0)

    producer = threading.Thread(target=produce, daemon=True)
    try:
        def all_up() -> bool:
            try:
                result = api(ports["prom"], "query?query=up")["result"]
            except OSError:
                return False
            return len(result) == 3 and all(r["value"][1] == "1" for r in result)

        wait_until(all_up, 60, "Prometheus scraping both pollers and the exporter")
        producer.start()
        time.sleep(20)  # jobs firing on every shard; a healthy fleet pages for nothing
        assert firing(ports["prom"]) == []
        procs[0].kill()
        procs[0].wait()
        killed = time.monotonic()
        paged: set[str] = set()
        while time.monotonic() - killed < PAGE_WITHIN_S + 30 and paged != {"0", "1"}:
            alerts = firing(ports["prom"])
            wrong = [a for a in alerts if a.get("shard") in ("2", "3")]
            assert not wrong, f"paged for a healthy shard: {wrong}"
            paged |= {a["shard"] for a in alerts if a["alertname"] == "SchedulerShardJobsOverdue"}
            if paged == {"0", "1"}:
                break
            time.sleep(2)
        took = time.monotonic() - killed
        assert paged == {"0", "1"}, f"paged for {paged} after {took:.0f} s"
        assert took <= PAGE_WITHIN_S, f"the page took {took:.0f} s"
        assert not [a for a in firing(ports["prom"]) if a.get("shard") in ("2", "3")]
    finally:
        halt.set()
        kill_all(procs)
        client.close()
        store.close()
