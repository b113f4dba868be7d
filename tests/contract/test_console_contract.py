"""The web console on both stores, through its HTTP interface (Starlette's test client):
every page renders from the library's reads, bad input gets a 400 with one line, actions
are refused without a session and a CSRF token and work with them, and nothing is
written by a refused action. The real-browser tests are in tests/browser."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from starlette.testclient import TestClient

from scheduler import Client, Status
from scheduler.console.app import build
from scheduler.console.guard import COOKIE, Guard
from scheduler.console.pages import Fleet
from scheduler.store import SchemaOptions, Store
from tests.conftest import make_store

TOKEN = "t0ken-for-the-console-tests"


@pytest.fixture
def filled(store_kind: str, request: Any, tmp_path: Any) -> Iterator[Client]:
    store: Store = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=4))
    client = Client(store)
    now = datetime.now(UTC)
    client.schedule("soon", now + timedelta(hours=1), "email", {"to": "a"})
    for i in range(3):
        client.schedule(f"dead{i}", now + timedelta(hours=2), "payment" if i else "email", {"i": i})
        job = client.get(f"dead{i}")
        store.record_dead(job, f"HTTP 500 from the gateway ({i})", client.clock.now_ms())
    client.recurring.create("nightly", kind="report", cron="0 3 * * *", tz="Europe/Lisbon")
    yield client
    client.close()
    store.close()


def console(client: Client, allow_actions: bool = True) -> TestClient:
    fleet = Fleet(client, lambda: None, step_s=1)
    fleet.sample()
    return TestClient(build(client, fleet, Guard(TOKEN, allow_actions)))


def sign_in(http: TestClient) -> str:
    r = http.post("/login", data={"who": "alice", "token": TOKEN}, follow_redirects=False)
    assert r.status_code == 303 and COOKIE in r.cookies
    page = http.get("/dead").text
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert csrf, "a signed-in page carries the CSRF token"
    return csrf.group(1)


def test_every_page_renders_from_the_store(filled: Client):
    http = console(filled)
    job = filled.get("soon")
    bucket_iso = datetime.fromtimestamp(job.bucket, UTC).isoformat().replace("+00:00", "Z")
    for path, expect in [
        ("/fleet", "Lag per shard"), ("/fleet/live", 'id="heatmap"'),
        (f"/buckets?at={bucket_iso}&shard={job.shard}", "soon"),
        ("/jobs?id=soon", "pending"), ("/schedules", "nightly"),
        ("/dead", "dead1"), ("/dead?kind=payment", "dead2"), ("/audit?run=1", 'id="violations"'),
        ("/login", "token"),
    ]:
        r = http.get(path)
        assert r.status_code == 200, (path, r.text[-500:])
        assert expect in r.text, path
    assert "dead0" not in http.get("/dead?kind=payment").text
    by_error = http.get("/dead?error=%281%29").text
    assert "dead1" in by_error and "dead2" not in by_error


@pytest.mark.parametrize("path, status, says", [
    ("/jobs?id=nope", 404, "nope"),
    ("/buckets?at=yesterday&shard=0", 400, "ISO 8601"),
    ("/buckets?at=2026-12-01T09:00Z&shard=99", 400, "out of range"),
    ("/audit?from=2026-12-01T00:00Z&to=2026-12-02T00:00Z&run=1", 400, "at most an hour"),
])
def test_bad_input_gets_one_line_and_a_status(filled: Client, path: str, status: int, says: str):
    r = console(filled).get(path)
    assert r.status_code == status and says in re.search(r'id="error">([^<]*)<', r.text).group(1)  # type: ignore[union-attr]


def test_actions_are_refused_without_a_session_or_csrf_and_change_nothing(filled: Client):
    http = console(filled)
    r = http.post("/dead/replay", data={"job_id": "dead1", "csrf": "x"})
    assert r.status_code == 403 and "sign in" in r.text
    assert http.post("/login", data={"who": "mallory", "token": "wrong-token-wrong"}).status_code == 403
    sign_in(http)
    assert http.post("/jobs/cancel", data={"job_id": "soon", "csrf": "forged"}).status_code == 403
    assert filled.get("soon").status is Status.PENDING
    assert {d.job_id for d in filled.dead_letters()} == {"dead0", "dead1", "dead2"}
    # Read-only console: even a valid token cannot sign in.
    ro = console(filled, allow_actions=False)
    assert ro.post("/login", data={"who": "alice", "token": TOKEN}).status_code == 403
    assert "actions are off" in ro.post("/dead/replay", data={"job_id": "dead1"}).text


def test_signed_in_actions_replay_cancel_pause_resume_and_refire(filled: Client, caplog: Any):
    http = console(filled)
    csrf = sign_in(http)
    with caplog.at_level("INFO", logger="scheduler.console"):
        r = http.post("/dead/replay", data={"job_id": ["dead1", "dead2"], "csrf": csrf})
    assert r.status_code == 200 and "Replayed 2 dead letters" in r.text
    assert {d.job_id for d in filled.dead_letters()} == {"dead0"}
    assert filled.get("dead1").status is Status.PENDING and filled.get("dead1").attempts == 0
    logged = [rec for rec in caplog.records if getattr(rec, "action", "") == "console_replay"]
    assert len(logged) == 1 and logged[0].who == "alice"
    assert TOKEN not in caplog.text

    assert "Cancelled the job" in http.post("/jobs/cancel", data={"job_id": "soon", "csrf": csrf}).text
    assert "not pending" in http.post("/jobs/cancel", data={"job_id": "soon", "csrf": csrf}).text
    assert filled.get("soon").status is Status.CANCELLED
    http.post("/schedules/pause", data={"schedule_id": "nightly", "csrf": csrf})
    assert str(filled.recurring.get("nightly").state) == "paused"
    http.post("/schedules/resume", data={"schedule_id": "nightly", "csrf": csrf})
    assert str(filled.recurring.get("nightly").state) == "active"
    r = http.post("/refire", data={"from": "", "to": "", "kind": "", "csrf": csrf})
    assert r.status_code == 200 and "Re-fired 0 jobs" in r.text


def test_a_script_acts_with_the_token_as_a_bearer_header(filled: Client):
    http = console(filled)
    wrong = http.post("/dead/replay", data={"job_id": "dead0"}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 403
    assert {d.job_id for d in filled.dead_letters()} == {"dead0", "dead1", "dead2"}
    r = http.post("/dead/replay", data={"job_id": "dead0"},
                  headers={"Authorization": f"Bearer {TOKEN}", "X-Scheduler-User": "ops-bot"})
    assert r.status_code == 200 and "Replayed 1 dead letters" in r.text
    assert "dead0" not in {d.job_id for d in filled.dead_letters()}
    off = console(filled, allow_actions=False)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert off.post("/dead/replay", data={"job_id": "dead1"}, headers=bearer).status_code == 403
