"""``scheduler run --processes 2`` with real processes, ZooKeeper and Cassandra: two
fleet members under one supervisor, each serving metrics on its own port; a member
killed -9 is restarted and rejoins; SIGTERM stops everything cleanly (exit 0); every
job fires, none early."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from scheduler import Client
from scheduler.domain.clock import SystemClock
from scheduler.fleet.view import read_fleet
from scheduler.store import SchemaOptions, open_store
from tests.conftest import ZOOKEEPER_HOSTS, cassandra_url
from tests.handlers import read_records
from tests.procs import ROOT, schedule, wait_until


def free_port_pair() -> int:
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return int(port)
    raise AssertionError("no two free consecutive ports")


def children(pid: int) -> set[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return {int(p) for p in text.split()}


def metrics_up(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return b"scheduler_" in r.read()
    except OSError:
        return False


def test_two_processes_under_one_supervisor(cassandra_keyspace, zookeeper_available, zk_root, tmp_path):
    url = cassandra_url(cassandra_keyspace)
    store = open_store(url)
    store.apply_schema(SchemaOptions(shard_count=8, bucket_width_s=10), SystemClock().now_ms())
    out = tmp_path / "fired.log"
    zk = f"zookeeper://{ZOOKEEPER_HOSTS}{zk_root}"
    base = free_port_pair()
    env = {**os.environ, "SCHEDULER_TEST_OUT": str(out), "SCHEDULER_STORE": url}
    with open(tmp_path / "run.log", "wb") as log:
        sup = subprocess.Popen([sys.executable, "-m", "scheduler", "run",
                                "--handler", "tests.handlers:record",
                                "--processes", "2", "--coordinator", zk, "--session-timeout", "4",
                                "--metrics-address", f"127.0.0.1:{base}", "--name", "host-a", "--log-json"],
                               cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    client = Client(store)

    def members() -> list[str]:
        snap = read_fleet(zk)
        return sorted(snap.members) if snap else []

    try:
        wait_until(lambda: len(members()) == 2, 60, "both members in the fleet")
        assert all(m.startswith("host-a-") for m in members()), members()
        wait_until(lambda: metrics_up(base) and metrics_up(base + 1), 30, "metrics on both ports")
        due = schedule(client, 40, over_s=8, lead_s=3)
        first = children(sup.pid)
        assert len(first) == 2
        victim = max(first)
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: len(children(sup.pid) - first) == 1 and len(children(sup.pid)) == 2, 30,
                   "the killed member restarted")
        wait_until(lambda: len(members()) == 2 and metrics_up(base) and metrics_up(base + 1), 60,
                   "the restarted member back in the fleet")
        wait_until(lambda: set(due) <= {r.job_id for r in read_records(str(out))}, 60, "every job fired")
        kids = children(sup.pid)
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=60) == 0
        assert not any(Path(f"/proc/{p}").exists() and "zombie" not in _state(p) for p in kids)
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
        client.close()
        store.close()
    records = [r for r in read_records(str(out)) if r.job_id in due]
    assert not [r for r in records if r.fired_ms < r.due_ms]
    text = (tmp_path / "run.log").read_text()
    assert "restarting it in" in text and "supervisor stopped: exit 0" in text


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"
