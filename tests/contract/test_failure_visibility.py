"""Failures are visible, on both stores: every failed attempt is logged (a storm as a
summary), ``get`` shows the payload, the attempts, the last error and where a job came
from, and a replayed job no longer shows its old firing."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest

from scheduler import App, Client, Job, JobSpec
from scheduler.clock import FakeClock
from scheduler.poller.recorder import ERROR_CHARS, FAILURE_LINES
from scheduler.store import SchemaOptions
from tests.conftest import make_store
from tests.contract.test_poller_contract import T0, T0_MS, drive, make_poller

SECRET = "payload-secret-4f1c"


@pytest.fixture
def fstore(store_kind: str, request: Any, tmp_path: Any):
    st = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=4), now_ms=T0_MS - 60_000)
    yield st
    st.close()


def failing_app(max_attempts: int) -> App:
    app = App()

    @app.handler("email", max_attempts=max_attempts, backoff_base_s=1, backoff_cap_s=1)
    def email(job: Job) -> None:
        if job.payload.get("long"):
            raise ValueError("x" * 5000)
        raise ValueError(f"bad address for {job.job_id}")

    return app


def actions(caplog: pytest.LogCaptureFixture, *names: str) -> list[dict[str, Any]]:
    """The records with one of these ``action`` tags, as dicts (their extra fields
    included) with the formatted message under ``text``."""
    return [{**vars(r), "text": r.getMessage()} for r in caplog.records
            if getattr(r, "action", None) in names]


def test_every_failed_attempt_is_logged_with_its_error_and_one_traceback(fstore, caplog):
    """Nine failed attempts (under the limit of ten a minute): each on its own line."""
    clock = FakeClock(T0_MS)
    client = Client(fstore, clock=clock)
    client.schedule_many([JobSpec(f"j{i}", T0 + timedelta(seconds=5), "email", {"to": SECRET})
                          for i in range(2)])
    client.schedule("long", T0 + timedelta(seconds=5), "email", {"long": True, "to": SECRET})
    poller = make_poller(fstore, clock, None, app=failing_app(max_attempts=3))
    with caplog.at_level(logging.WARNING, logger="scheduler.poller"):
        drive(poller, clock, 20)
    failed = actions(caplog, "job_attempt_failed")
    dead = actions(caplog, "job_dead")
    assert sorted((r["job_id"], r["attempt"]) for r in failed) == sorted(
        (j, a) for j in ("j0", "j1", "long") for a in (1, 2))
    assert sorted((r["job_id"], r["attempt"]) for r in dead) == [("j0", 3), ("j1", 3), ("long", 3)]
    j1 = next(r for r in failed if r["job_id"] == "j1" and r["attempt"] == 2)
    assert j1["levelno"] == logging.WARNING and j1["kind"] == "email" and j1["error_type"] == "ValueError"
    assert "job j1 (email) attempt 2 failed: ValueError: bad address for j1; retry at " in j1["text"]
    assert next(r for r in dead if r["job_id"] == "j1")["text"].endswith("; dead-lettered")
    long = next(r["text"] for r in failed if r["job_id"] == "long")
    error = long.split(" failed: ", 1)[1].split("; retry at ", 1)[0]
    assert error == ("ValueError: " + "x" * 5000)[:ERROR_CHARS] + "...", "the message is cut"
    traced = [r for r in caplog.records if r.exc_info]
    assert len(traced) == 1, "one traceback per kind and exception type"
    assert "raise ValueError" in caplog.text
    assert SECRET not in caplog.text, "the payload is never logged"


def test_a_storm_of_failures_becomes_a_summary(fstore, caplog):
    clock = FakeClock(T0_MS)
    client = Client(fstore, clock=clock)
    n = FAILURE_LINES + 25
    client.schedule_many([JobSpec(f"s{i}", T0 + timedelta(seconds=5), "email", {}) for i in range(n)])
    poller = make_poller(fstore, clock, None, app=failing_app(max_attempts=1))
    with caplog.at_level(logging.WARNING, logger="scheduler.poller"):
        drive(poller, clock, 10)
        assert len(actions(caplog, "job_dead")) == FAILURE_LINES
        assert poller.stats.dead == n
        assert not actions(caplog, "job_failures_summarised"), "not before the minute is over"
        clock.advance(60)
        poller.record_outcomes()
    [summary] = actions(caplog, "job_failures_summarised")
    assert summary["text"] == "kind email: 25 more failed attempts in the last 60 s (ValueError 25)"
    assert summary["levelno"] == logging.WARNING and summary["by_type"] == {"ValueError": 25}
