"""The real CLI in a subprocess, on the embedded store (no servers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.store.base import SCHEMA_VERSION


def run(*args: str, store: str | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    if store:
        env["SCHEDULER_STORE"] = store
    return subprocess.run([sys.executable, "-m", "scheduler", *args], capture_output=True,
                          text=True, env=env, input=stdin, timeout=60)


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/cli.db"
    res = run("schema", "apply", "--json", store=url)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["version"] == SCHEMA_VERSION
    return url


def test_schedule_get_cancel_reschedule(store):
    res = run("schedule", "--id", "a", "--at", "2030-01-01T09:00:00+01:00", "--kind", "email",
              "--payload", '{"to": "x"}', "--json", store=store)
    assert res.returncode == 0, res.stderr
    job = json.loads(res.stdout)
    assert set(job) >= {"job_id", "kind", "due_at", "bucket", "shard", "status", "attempts", "fired_at"}
    assert job["due_at"] == "2030-01-01T08:00:00+00:00" and job["status"] == "pending"
    got = json.loads(run("get", "a", "--json", store=store).stdout)
    assert {k: got[k] for k in job} == job  # get shows more: payload, history
    moved = json.loads(run("reschedule", "a", "--at", "2031-01-01T00:00:00Z", "--json", store=store).stdout)
    assert moved["due_at"] == "2031-01-01T00:00:00+00:00"
    assert json.loads(run("cancel", "a", "--json", store=store).stdout)["cancelled"] is True
    again = run("cancel", "a", "--json", store=store)
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr.startswith("error: no pending job 'a' to cancel") and again.stderr.count("\n") == 1
    assert json.loads(run("get", "a", "--json", store=store).stdout)["status"] == "cancelled"


def test_human_output(store):
    res = run("schedule", "--id", "h", "--at", "2030-01-01T00:00:00Z", "--kind", "k", store=store)
    assert res.returncode == 0 and "pending" in res.stdout


def test_load_and_shards(store, tmp_path):
    lines = [json.dumps({"id": f"l{i}", "at": "2030-01-01T00:00:00Z", "kind": "k", "payload": i})
             for i in range(300)]
    (tmp_path / "jobs.jsonl").write_text("\n".join(lines) + "\n")
    res = run("load", str(tmp_path / "jobs.jsonl"), "--json", store=store)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"loaded": 300}
    assert json.loads(run("get", "l299", "--json", store=store).stdout)["status"] == "pending"
    shards = json.loads(run("shards", "show", "--json", store=store).stdout)
    assert shards["bucket_width_s"] == 60 and shards["layouts"][0]["shard_count"] == 16
    res = run("shards", "resize", "--count", "32", "--at", "2029-01-01T00:00:00Z", "--json", store=store)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["shard_count"] == 32
    tbl = run("shards", "show", store=store)
    assert "32" in tbl.stdout


BAD = [
    (["schedule", "--id", "x", "--at", "next tuesday", "--kind", "k"], "cannot parse time"),
    (["schedule", "--id", "x", "--at", "2030-01-01T00:00:00", "--kind", "k"], "no UTC offset"),
    (["schedule", "--id", "", "--at", "2030-01-01T00:00:00Z", "--kind", "k"], "non-empty"),
    (["schedule", "--id", "x", "--at", "2030-01-01T00:00:00Z", "--kind", "k",
      "--payload", json.dumps("x" * 70_000)], "limit is 65536"),
    (["schedule", "--id", "x", "--at", "2030-01-01T00:00:00Z", "--kind", "k", "--payload", "{bad"],
     "not valid JSON"),
    (["shards", "resize", "--count", "8", "--at", "2020-01-01T00:00:00Z"], "earliest allowed cutover"),
    (["shards", "resize", "--count", "0", "--at", "2030-01-01T00:00:00Z"], "shard count"),
    (["schedule", "--id", "x", "--at", "2038-01-18T00:00:00Z", "--kind", "k"], "too far ahead"),
    (["schema", "apply", "--retention", "7days"], "--retention '7days' is not a duration"),
    (["schema", "apply", "--dead-retention", "0d"], "--dead-retention '0d' must be longer than zero"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_is_one_line_and_writes_nothing(store, args, message):
    res = run(*args, store=store)
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], res.stderr
    assert run("get", "x", store=store).returncode == 1
    shards = json.loads(run("shards", "show", "--json", store=store).stdout)
    assert len(shards["layouts"]) == 1


@pytest.mark.parametrize("url,message", [
    ("redis://localhost/0", "unknown store URL"),
    ("sqlite:///no/such/folder/x.db", "does not exist"),
    ("cassandra://127.0.0.1:1/ks", "cannot reach Cassandra"),
    ("cassandra://127.0.0.1/bad-name", "keyspace name"),
])
def test_bad_or_unreachable_store(url, message):
    res = run("schedule", "--id", "x", "--at", "2030-01-01T00:00:00Z", "--kind", "k", "--store", url)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr


def test_no_store_given():
    res = run("get", "x")
    assert res.returncode == 1 and "pass --store URL or set SCHEDULER_STORE" in res.stderr


def test_schema_missing_is_explained(tmp_path):
    res = run("get", "x", store=f"sqlite:///{tmp_path}/empty.db")
    assert res.returncode == 1 and "scheduler schema apply" in res.stderr


def test_demo_json_summary():
    res = run("demo", "--jobs", "300", "--pollers", "3", "--seconds", "2", "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert {"scheduled", "fired", "duplicates", "early", "lost", "lateness_p50_ms",
            "lateness_p99_ms"} <= set(summary)
    assert summary["scheduled"] == summary["fired"] == 300
    assert summary["lost"] == summary["early"] == summary["duplicates"] == 0


def test_dead_letters_cli(store, tmp_path):
    res = run("dead", "list", "--json", store=store)
    assert res.returncode == 0 and json.loads(res.stdout) == []
    res = run("dead", "replay", "nope", store=store)
    assert res.returncode == 1 and "not in the dead letters" in res.stderr
    res = run("dead", "replay", store=store)
    assert res.returncode == 1 and "--all" in res.stderr


def test_run_rejects_a_bad_handler(store):
    res = run("run", "--handler", "no_such_module_zz:f", store=store)
    assert res.returncode == 1 and "cannot import" in res.stderr
    res = run("run", "--shards", "9-3", "--handler", "json:dumps", store=store)
    assert res.returncode == 1 and "shard spec" in res.stderr


def test_operator_views_in_json(store):
    run("schedule", "--id", "v1", "--at", "2030-01-01T09:00:30Z", "--kind", "k", store=store)
    lag = json.loads(run("lag", "--json", store=store).stdout)
    assert lag and {"shard", "owner", "drained_until", "lag_s", "backlog", "backlog_capped"} <= set(lag[0])
    assert [r["lag_s"] for r in lag] == sorted((r["lag_s"] for r in lag), reverse=True)
    status = json.loads(run("status", "--json", store=store).stdout)
    assert status["pollers"] is None and len(status["unowned_shards"]) == len(lag)
    assert status["layouts"][0]["shard_count"] == len(lag)
    rows = json.loads(run("inspect", "2030-01-01T09:00:00Z", "--json", store=store).stdout)["rows"]
    assert [r["job_id"] for r in rows] == ["v1"] and rows[0]["status"] == "pending"
    fc = json.loads(run("forecast", "--hours", "2", "--json", store=store).stdout)
    assert fc["total"] == 0 and len(fc["per_bucket"]) >= 120


@pytest.mark.parametrize("args, message", [
    (("inspect", "yesterday"), "neither epoch seconds nor an ISO 8601 time"),
    (("inspect", "61"), "not a multiple of the bucket width"),
    (("inspect", "2030-01-01T09:00:00Z", "--shard", "99"), "--shard 99 is out of range"),
    (("forecast", "--hours", "0"), "--hours 0.0 is out of range"),
    (("exporter", "--address", "nowhere"), "is not HOST:PORT"),
])
def test_operator_views_reject_bad_input(store, args, message):
    res = run(*args, store=store)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.strip().count("\n") == 0 and message in res.stderr


def test_retention_is_set_changed_and_shown(store):
    res = run("schema", "apply", "--retention", "12h", "--json", store=store)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["retention_s"] == 43_200 and data["dead_retention_s"] == 30 * 86_400
    assert data["retention_changed"]
    human = run("schema", "apply", "--retention", "3d", store=store).stdout
    assert "retention changed (was 12h" in human and "rows already written keep the expiry" in human
    again = json.loads(run("schema", "apply", "--json", store=store).stdout)
    assert again["retention_s"] == 3 * 86_400 and not again["retention_changed"]
    status = json.loads(run("status", "--json", store=store).stdout)
    assert status["retention_s"] == 3 * 86_400 and status["dead_retention_s"] == 30 * 86_400
    assert "retention: jobs 3d" in run("status", store=store).stdout
    missing = run("get", "nope", store=store)
    assert missing.returncode == 1 and "unknown, or expired" in missing.stderr


@pytest.mark.parametrize(("extra", "message"), [
    (["--processes", "2"], "--processes needs a ZooKeeper fleet"),
    (["--processes", "-1"], "--processes must be >= 0"),
    (["--processes", "2", "--shards", "0-3"], "--processes needs a fleet: drop --shards"),
])
def test_run_refuses_processes_it_cannot_split(store, extra, message):
    res = run("run", "--handler", "tests.handlers:record", "--metrics-address", "off", *extra, store=store)
    assert res.returncode == 1
    assert message in res.stderr and res.stderr.count("\n") == 1, res.stderr


def test_audit_exits_2_on_a_lost_job_and_0_otherwise(store):
    from scheduler.domain.keys import bucket_of_ms
    from scheduler.domain.model import Job
    from scheduler.domain.progress import Checkpoint
    from scheduler.store import open_store

    t0 = 1_800_000_000_000
    window = ["--from", "2027-01-15T08:00:00Z", "--to", "2027-01-15T08:01:00Z"]
    res = run("audit", *window, "--json", store=store)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["violations"] == []
    st = open_store(store)
    try:
        bucket = bucket_of_ms(t0, st.meta().bucket_width_s)
        st.claim_shard(0, "p0", 5, bucket - 60, t0)
        st.save_checkpoint(0, 5, Checkpoint(bucket), t0 + 61_000)
        st.insert_many([Job(job_id="lost", kind="k", data=b"{}", data_json=True, due_ms=t0 + 1000,
                            fire_ms=t0 + 1000, bucket=bucket, shard=0)])
    finally:
        st.close()
    res = run("audit", *window, "--json", store=store)
    assert res.returncode == 2
    out = json.loads(res.stdout)
    assert [v["job_id"] for v in out["violations"]] == ["lost"] and out["totals"]["pending"] == 1
    human = run("audit", *window, store=store)
    assert human.returncode == 2 and "VIOLATION" in human.stdout and "'lost'" in human.stdout
    bad = run("audit", "--from", "2027-01-15T08:00:00Z", "--to", "2027-01-15T07:00:00Z", store=store)
    assert bad.returncode == 1 and "--to is before --from" in bad.stderr


def test_refire_a_window_dry_run_then_twice_fires_once(store):
    from datetime import UTC, datetime, timedelta

    from scheduler.domain.clock import FakeClock
    from scheduler.producer.client import Client

    now = datetime.now(UTC)
    # The producer's clock two minutes back: the late-write rule then keeps each job's
    # due time as its fire time, so the firings recorded at ``now`` come after their fire
    # times (as real ones do) and every row lies in the window's buckets. With the real
    # clock a job is placed at now + late margin, in the next minute near its end.
    client = Client(store, clock=FakeClock(int(now.timestamp() * 1000) - 120_000))
    try:
        jobs = client.schedule_many([
            {"id": "r1", "at": (now - timedelta(seconds=30)).isoformat(), "kind": "email",
             "payload": {"a": 1}},
            {"id": "r2", "at": (now - timedelta(seconds=20)).isoformat(), "kind": "sms"}])
        client.store.record_fired(jobs, int(now.timestamp() * 1000))
    finally:
        client.close()
    window = ["--from", (now - timedelta(minutes=1)).isoformat(), "--to", now.isoformat()]
    dry = json.loads(run("refire", *window, "--dry-run", "--json", store=store).stdout)
    assert dry["count"] == 2 and dry["by_kind"] == {"email": 1, "sms": 1}
    assert run("get", dry["jobs"][0], store=store).returncode == 1  # a dry run writes nothing
    first = run("refire", *window, "--json", store=store)
    assert first.returncode == 0, first.stderr
    again = json.loads(run("refire", *window, "--json", store=store).stdout)
    assert again["jobs"] == json.loads(first.stdout)["jobs"] == dry["jobs"]
    got = json.loads(run("get", dry["jobs"][0], "--json", store=store).stdout)
    assert got["refired_from"] == "r1" and got["kind"] == "email" and got["status"] == "pending"
    only = json.loads(run("refire", *window, "--kind", "sms", "--dry-run", "--json", store=store).stdout)
    assert only["by_kind"] == {"sms": 1}


@pytest.mark.parametrize("args, says", [
    (["--allow-actions"], "--allow-actions needs a token"),
    (["--address", "9470"], "must look like HOST:PORT"),
    (["--sample-interval", "0"], "--sample-interval must be at least 1 second"),
])
def test_console_refuses_bad_options_with_one_line(store, args, says):
    res = run("console", *args, store=store)
    assert res.returncode != 0 and says in res.stderr
    assert len([line for line in res.stderr.splitlines() if line.strip()]) == 1, res.stderr


def test_a_client_of_a_missing_embedded_store_raises_and_creates_no_file(tmp_path):
    from scheduler import Client
    from scheduler.errors import StoreUnavailable

    path = tmp_path / "missing.db"
    with pytest.raises(StoreUnavailable):
        Client(f"sqlite:///{path}")
    assert not path.exists(), "a client made an empty store file"
