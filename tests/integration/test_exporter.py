"""The lag exporter against real processes: kill a poller, its shards' lag grows in the
exporter's output, and the lag alert fires in promtool's rule test fed with that output."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from scheduler import Client
from scheduler.domain.clock import SystemClock
from scheduler.fleet.view import read_fleet
from scheduler.observe.exporter import LagExporter
from scheduler.store import SchemaOptions, open_store
from tests.conftest import ZOOKEEPER_HOSTS, cassandra_url
from tests.procs import ROOT, schedule, start_poller, wait_until

WIDTH = 5  # seconds per bucket: a healthy shard's lag stays under ~10 s
PROM = ROOT / "ops" / "prometheus"


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def lag_of(metrics: dict[str, float], shard: int) -> float:
    return metrics[f'scheduler_shard_lag_seconds{{shard="{shard}"}}']


def start_exporter(url: str, log: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "scheduler", "exporter", "--store", url,
                                 "--address", "127.0.0.1:0", "--interval", "1", *extra],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=fh)
    found: list[str] = []

    def bound() -> bool:
        m = re.search(r"on (http://\S+/metrics)", log.read_text())
        if m:
            found.append(m.group(1))
        return bool(m) or proc.poll() is not None

    wait_until(bound, 60, "the exporter to serve")
    assert found, f"exporter exited: {log.read_text()}"
    return proc, found[0]


def humanize_duration(seconds: int) -> str:
    """Prometheus' humanizeDuration for whole seconds under an hour."""
    return f"{seconds // 60}m {seconds % 60}s" if seconds >= 60 else f"{seconds}s"


@pytest.mark.serial  # its lag slope is per sample, each a scrape and 1 s: a neighbour's load bends it
def test_killed_pollers_shards_lag_grows_and_the_alert_fires(cassandra_keyspace, tmp_path, promtool):
    url = cassandra_url(cassandra_keyspace)
    store = open_store(url)
    store.apply_schema(SchemaOptions(shard_count=4, bucket_width_s=WIDTH), SystemClock().now_ms())
    client = Client(store)
    procs = [start_poller(url, tmp_path / "a.log", "--shards", "0-1"),
             start_poller(url, tmp_path / "b.log", "--shards", "2-3")]
    exporter, metrics_url = start_exporter(url, tmp_path / "exporter.log")
    procs.append(exporter)
    try:
        wait_until(lambda: all(lag_of(scrape(metrics_url), s) < 2 * WIDTH for s in range(4)), 60,
                   "every shard to be drained up to date")
        due = schedule(client, 200, 30, lead_s=2)
        samples: list[dict[str, float]] = []
        for _ in range(5):
            samples.append(scrape(metrics_url))
            time.sleep(1)
        procs[0].kill()  # kill -9 the poller of shards 0 and 1
        procs[0].wait()
        killed_at = len(samples)
        for _ in range(25):
            samples.append(scrape(metrics_url))
            time.sleep(1)
        after = samples[killed_at:]
        for s in (0, 1):
            lags = [lag_of(m, s) for m in after]
            # It may have just drained a bucket when killed (lag ~0): ~24 s later it is
            # past anything a live shard shows (under 12 s). After the exporter's next two
            # refreshes (1 s apart; the first may still bring the dead poller's last
            # checkpoint) it never goes down.
            assert lags[-1] > 20 and all(b >= a for a, b in itertools.pairwise(lags[3:])), lags
            slope = (lags[-1] - lags[5]) / (len(lags) - 6)
            assert 0.8 < slope < 1.2, f"lag of a dead shard grows with the clock, got {slope:.2f} s/s"
        for s in (2, 3):
            assert max(lag_of(m, s) for m in after) < 2 * WIDTH + 2, "live shards stay current"
        dead_backlog = [sum(m[f'scheduler_shard_due_backlog{{shard="{s}"}}'] for s in (0, 1)) for m in after]
        assert dead_backlog[-1] > max(10, dead_backlog[0]), dead_backlog
        # Jobs of the live shards kept firing while the others piled up.
        now_ms = SystemClock().now_ms()
        jobs = store.get_many(list(due))
        live_due = [j for j in jobs.values() if j.shard in (2, 3) and j.fire_ms < now_ms - 3000]
        assert live_due and all(j.fired_ms is not None for j in live_due)
        assert all(m[f'scheduler_shard_due_backlog{{shard="{s}"}}'] <= 2 for m in after[-5:] for s in (2, 3))
        # The surviving poller's own metrics (bound to 127.0.0.1, a free port here).
        poller_url = re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)",
                               (tmp_path / "b.log.log").read_text())
        assert poller_url, "the poller did not say where it serves metrics"
        own = scrape(poller_url.group(1))
        assert own["scheduler_owned_shards"] == 2
        assert set(k for k in own if k.startswith("scheduler_checkpoint_lag_seconds")) == {
            'scheduler_checkpoint_lag_seconds{shard="2"}', 'scheduler_checkpoint_lag_seconds{shard="3"}'}
        assert own['scheduler_jobs_fired_total{kind="record"}'] >= len(live_due)
        assert own["scheduler_fire_lateness_seconds_count"] >= len(live_due)

        # The same series through the alert rule: observed samples, then the dead shards'
        # lag going on at one second per second (as measured above) for 7 minutes, and
        # the live shards repeating what they did.
        extra = 420
        series = []
        for s in range(4):
            observed = [round(lag_of(m, s)) for m in samples]
            if s in (0, 1):
                tail = f" {observed[-1] + 1}+1x{extra - 1}"
            else:
                cycle = observed[killed_at:]
                tail = " " + " ".join(str(cycle[i % len(cycle)]) for i in range(extra))
            series.append((s, " ".join(map(str, observed)) + tail))
        end = len(samples) - 1 + extra  # seconds from the first sample
        final = {s: round(lag_of(samples[-1], s)) + extra for s in (0, 1)}
        test_file = tmp_path / "observed_test.yml"
        lines = [f"rule_files: ['{PROM / 'alerts.yml'}']", "evaluation_interval: 1s", "tests:",
                 "  - interval: 1s", "    input_series:"]
        for s, values in series:
            name = f'scheduler_shard_lag_seconds{{job="scheduler-exporter",shard="{s}"}}'
            lines += [f"      - series: '{name}'",
                      f"        values: '{values}'"]
        lines += ["    alert_rule_test:",
                  f"      - eval_time: {len(samples) - 1}s",
                  "        alertname: SchedulerShardLagHigh",
                  "        exp_alerts: []",
                  f"      - eval_time: {end}s",
                  "        alertname: SchedulerShardLagHigh",
                  "        exp_alerts:"]
        for s in (0, 1):
            lines += [f"          - exp_labels: {{severity: page, shard: '{s}'}}",
                      "            exp_annotations:",
                      f"              summary: 'shard {s} is {humanize_duration(final[s])} behind'",
                      "              runbook_url: 'docs/runbook.md#schedulershardlaghigh'"]
        test_file.write_text("\n".join(lines) + "\n")
        res = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True,
                             timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        client.close()
        store.close()


@pytest.mark.zookeeper
def test_exporter_reads_owners_from_zookeeper(cassandra_keyspace, zk_root, tmp_path):
    url = cassandra_url(cassandra_keyspace)
    zk = f"zookeeper://{ZOOKEEPER_HOSTS}{zk_root}"
    store = open_store(url)
    store.apply_schema(SchemaOptions(shard_count=4, bucket_width_s=WIDTH), SystemClock().now_ms())
    exporter = LagExporter(store, SystemClock(), lambda: read_fleet(zk), interval_s=1)
    poller = start_poller(url, tmp_path / "fired.log", "--coordinator", zk, "--session-timeout", "4")
    try:
        seen: list[object] = []

        def owned() -> list[bool]:
            exporter.refresh()
            seen[:] = [[r.owner for r in exporter._rows], exporter._members]
            return [r.owner is not None for r in exporter._rows]

        def log_tail() -> str:
            text = (tmp_path / "fired.log.log").read_text(errors="replace") if (
                tmp_path / "fired.log.log").exists() else ""
            return f"last seen (owners, members): {seen}; poller log tail:\n" + text[-3000:]

        try:
            wait_until(lambda: owned() == [True] * 4 and exporter._members == 1, 60,
                       "the poller to own every shard")
            poller.kill()
            poller.wait()
            wait_until(lambda: owned() == [False] * 4 and exporter._members == 0, 30,
                       "ZooKeeper to drop the dead poller's locks")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {log_tail()}") from None
    finally:
        if poller.poll() is None:
            poller.kill()
        store.close()
