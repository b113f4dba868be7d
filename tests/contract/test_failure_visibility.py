"""Failures are visible, on both stores: every failed attempt is logged (a storm as a
summary), ``get`` shows the payload, the attempts, the last error and where a job came
from, and a replayed job no longer shows its old firing."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest

from scheduler import App, Client, InvalidInput, Job, JobSpec
from scheduler.domain.clock import FakeClock
from scheduler.domain.model import Status
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


def kill(poller: Any, clock: FakeClock, job_id: str) -> None:
    """Fire ``job_id`` (due within 5 s) until it is dead: its handler always fails."""
    drive(poller, clock, 15)
    assert job_id in {d.job_id for d in poller.store.dead_letters()}


def test_a_job_named_twice_is_replayed_once(fstore, make_client):
    clock = FakeClock(T0_MS)
    client = make_client(fstore, clock=clock)
    for job_id in ("d1", "d2"):
        client.schedule(job_id, T0 + timedelta(seconds=5), "email", {"to": "a@example.com"})
    poller = make_poller(fstore, clock, None, app=failing_app(max_attempts=1))
    kill(poller, clock, "d1")
    kill(poller, clock, "d2")
    back = client.replay_dead(["d2", "d1", "d2", "d1"])
    assert [j.job_id for j in back] == ["d2", "d1"]
    assert len(client.describe("d1").replays) == 1 and len(client.describe("d2").replays) == 1


def test_a_dead_job_moved_leaves_the_dead_letters_and_a_stale_letter_is_never_replayed(fstore, make_client):
    clock = FakeClock(T0_MS)
    client = make_client(fstore, clock=clock)
    for job_id in ("d1", "d2", "d3"):
        client.schedule(job_id, T0 + timedelta(seconds=5), "email", {"to": "a@example.com"})
    poller = make_poller(fstore, clock, None, app=failing_app(max_attempts=1))
    for job_id in ("d1", "d2", "d3"):
        kill(poller, clock, job_id)
    later = T0 + timedelta(hours=1)
    client.reschedule("d1", later)
    assert client.get("d1").status.value == "pending"
    assert "d1" not in {d.job_id for d in client.dead_letters()}, "a dead job moved is armed again"
    # A letter left behind by a job armed again after it died (a move that raced its
    # death): replaying it would arm the job a second time.
    job = client.get("d1")
    fstore.record_dead(job.evolve(status=Status.DEAD), "boom", clock.now_ms())
    fstore.move(client.get("d1"), job)  # the move lands after the death: pending again
    assert client.get("d1").status.value == "pending"
    with pytest.raises(InvalidInput, match="not dead"):
        client.replay_dead(["d1"])
    assert sorted(j.job_id for j in client.replay_dead()) == ["d2", "d3"], "all passes over d1"


def test_a_replayed_job_has_no_fired_at_and_get_says_where_it_came_from(fstore, make_client):
    clock = FakeClock(T0_MS)
    client = make_client(fstore, clock=clock)
    client.schedule("d1", T0 + timedelta(seconds=5), "email", {"to": "a@example.com"})
    poller = make_poller(fstore, clock, None, app=failing_app(max_attempts=2))
    kill(poller, clock, "d1")
    dead = client.get("d1")
    assert dead.status.value == "dead" and dead.fired_ms is not None and dead.attempts == 2
    [letter] = [d for d in client.dead_letters() if d.job_id == "d1"]
    clock.advance(3600)
    replayed_at = clock.now_ms()
    [back] = client.replay_dead(["d1"])
    assert back.fired_ms is None
    got = client.get("d1")
    assert got.status.value == "pending" and got.fired_ms is None and got.fired_at is None
    assert got.attempts == 0 and got.last_error == "ValueError: bad address for d1"
    view = client.describe("d1")
    assert [(r.replayed_ms, r.died_ms, r.attempts, r.error) for r in view.replays] == [
        (replayed_at, letter.died_ms, 2, "ValueError: bad address for d1")]
    data = view.to_dict()
    assert data["fired_at"] is None and data["payload"] == {"to": "a@example.com"}
    assert data["payload_encoding"] == "json" and data["attempts"] == 0
    assert data["replays"] == [{"replayed_at": iso(replayed_at), "died_at": iso(letter.died_ms),
                                "attempts": 2, "error": "ValueError: bad address for d1"}]
    text = "\n".join(view.lines())
    assert f"replayed from dead letter at {iso(replayed_at)} (it died at {iso(letter.died_ms)} after 2 " \
           "attempts: ValueError: bad address for d1)" in text
    assert '{"to": "a@example.com"}' in text and "last_error  ValueError: bad address for d1" in text
    # Dead again, replayed again: both replays, newest first.
    kill(poller, clock, "d1")
    clock.advance(60)
    client.replay_dead(["d1"])
    assert [r.replayed_ms for r in client.describe("d1").replays] == [clock.now_ms(), replayed_at]


def test_get_shows_the_job_a_refire_copied_and_when_it_fired(fstore, make_client):
    from scheduler.observe.refire import refire_id

    clock = FakeClock(T0_MS)
    client = make_client(fstore, clock=clock)
    old = client.schedule("orig", T0 + timedelta(seconds=5), "email", b"\x00\x1b[31mraw")
    fstore.record_fired([old], T0_MS + 5_100)
    window = (T0_MS, T0_MS + 10_000)
    new_id = refire_id(window, "orig")
    client.schedule(new_id, T0 + timedelta(seconds=10), "email", b"\x00\x1b[31mraw")
    data = client.describe(new_id).to_dict()
    assert data["refired"] == {"from_job": "orig", "window_from": iso(window[0]),
                               "window_to": iso(window[1]), "original_fired_at": iso(T0_MS + 5_100)}
    assert data["payload"] == "ABtbMzFtcmF3" and data["payload_encoding"] == "base64"
    text = "\n".join(client.describe(new_id).lines())
    assert f"re-fired from job orig / original fire at {iso(T0_MS + 5_100)}" in text
    assert "\x1b" not in text, "control characters are escaped"
    gone = refire_id(window, "never-stored")
    client.schedule(gone, T0 + timedelta(seconds=10), "email", {})
    assert "re-fired from job never-stored / original no longer stored" in "\n".join(
        client.describe(gone).lines())
    assert client.describe("orig").to_dict()["refired"] is None
    assert client.describe("orig").replays == ()


def iso(ms: int) -> str:
    from scheduler.domain.keys import from_ms

    return from_ms(ms).isoformat()


def test_before_v005_a_replay_writes_nothing_and_get_still_works(store_kind, request, tmp_path):
    from scheduler.errors import SchemaError
    from tests.conftest import drop_table, reapply_version

    # A store without v005's replays table (see drop_table: jobs need v007's columns).
    st = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=4), now_ms=T0_MS - 60_000)
    drop_table(st, "replays")
    try:
        clock = FakeClock(T0_MS)
        client = Client(st, clock=clock)
        job = client.schedule("v4", T0 + timedelta(seconds=5), "email", {})
        st.record_dead(job, "boom", T0_MS + 5_000)
        with pytest.raises(SchemaError, match="schema apply"):
            client.replay_dead(["v4"])
        assert [d.job_id for d in st.dead_letters()] == ["v4"] and client.get("v4").status.value == "dead"
        assert client.describe("v4").replays == ()
        reapply_version(st, 5)
        client.replay_dead(["v4"])
        assert client.get("v4").status.value == "pending" and len(client.describe("v4").replays) == 1
    finally:
        st.close()


def test_a_dead_occurrence_can_be_read_and_is_passed_over_by_replay_all(fstore, make_client):
    from scheduler.errors import InvalidInput
    from scheduler.recurring.schedule import occurrence_id
    from tests.conftest import bucket_job

    clock = FakeClock(T0_MS)
    client = Client(fstore, clock=clock)
    one_shot = client.schedule("plain", T0 + timedelta(seconds=5), "email", {})
    occ_id = occurrence_id("nightly", 1, T0_MS + 5_000)
    occ = bucket_job(occ_id, T0_MS + 5_000, kind="email")
    fstore.insert_many([occ])
    fstore.record_dead(one_shot, "boom", T0_MS + 5_000)
    fstore.record_dead(occ, "boom", T0_MS + 5_000)
    # An occurrence's id names a stored job: get reads it (it used to refuse the id).
    assert client.get(occ_id).status.value == "dead"
    assert client.describe(occ_id).job.job_id == occ_id
    with pytest.raises(InvalidInput, match="schedule"):
        client.replay_dead([occ_id])
    # "All" replays the one-shot job and leaves the occurrence (its schedule goes on).
    assert [j.job_id for j in client.replay_dead()] == ["plain"]
    assert [d.job_id for d in fstore.dead_letters()] == [occ_id]
