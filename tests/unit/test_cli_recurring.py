"""``scheduler recurring preview`` in a subprocess: the fixed CLI contract."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.test_cli import run


def test_preview_json_gives_nominal_times_in_the_zone():
    res = run("recurring", "preview", "--cron", "30 2 * * *", "--tz", "Europe/Berlin",
              "--from", "2026-10-24T00:00:00Z", "--count", "3", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"fire_times": [
        "2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]}


def test_preview_of_an_interval_starts_at_its_anchor():
    res = run("recurring", "preview", "--every", "90s", "--from", "2026-01-01T00:00:00Z",
              "--count", "2", "--json")
    assert json.loads(res.stdout)["fire_times"] == ["2026-01-01T00:00:00+00:00",
                                                    "2026-01-01T00:01:30+00:00"]


@pytest.mark.parametrize("args,message", [
    (["--cron", "0 25 * * *"], "Bad hour"),
    (["--cron", "* * * * *", "--tz", "Nowhere/Land"], "unknown time zone"),
    (["--cron", "* * * * *", "--every", "5m"], "exactly one of"),
    ([], "exactly one of"),
    (["--every", "0m"], "longer than zero"),
])
def test_preview_bad_input_is_one_line_and_exit_1(args, message):
    res = run("recurring", "preview", *args)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and message in res.stderr


KEYS = {"schedule_id", "state", "kind", "cron", "every_s", "tz", "next_fire_at", "last_fired_at",
        "overlap", "misfire", "skipped"}


@pytest.fixture
def store(tmp_path: Any) -> str:
    url = f"sqlite:///{tmp_path}/rec.db"
    assert run("schema", "apply", store=url).returncode == 0
    return url


def test_create_get_list_pause_resume_delete(store):
    res = run("recurring", "create", "nightly", "--cron", "0 3 * * *", "--tz", "Europe/Lisbon",
              "--kind", "report", "--payload", '{"a": 1}', "--overlap", "skip", "--json", store=store)
    assert res.returncode == 0, res.stderr
    got = json.loads(run("recurring", "get", "nightly", "--json", store=store).stdout)
    assert set(got) >= KEYS and got["state"] == "active" and got["cron"] == "0 3 * * *"
    assert got["tz"] == "Europe/Lisbon" and got["next_fire_at"].endswith(("+00:00", "+01:00"))
    assert got["overlap"] == "skip" and got["misfire"] == "fire_once" and got["skipped"] == 0
    # The same definition again: a no-op, exit 0. Another one: exit 1, nothing changed.
    assert run("recurring", "create", "nightly", "--cron", "0 3 * * *", "--tz", "Europe/Lisbon",
               "--kind", "report", "--payload", '{"a": 1}', "--overlap", "skip", store=store).returncode == 0
    clash = run("recurring", "create", "nightly", "--cron", "0 4 * * *", "--kind", "report", store=store)
    assert clash.returncode == 1 and "exists" in clash.stderr
    assert run("recurring", "create", "five", "--every", "5m", "--kind", "tick", store=store).returncode == 0
    listed = json.loads(run("recurring", "list", "--json", store=store).stdout)
    assert [s["schedule_id"] for s in listed] == ["five", "nightly"] and listed[0]["every_s"] == 300
    paused = json.loads(run("recurring", "pause", "five", "--json", store=store).stdout)
    assert paused["state"] == "paused" and paused["next_fire_at"] is None
    assert json.loads(run("recurring", "resume", "five", "--json", store=store).stdout)["state"] == "active"
    assert run("recurring", "update", "five", "--every", "10m", store=store).returncode == 0
    assert json.loads(run("recurring", "get", "five", "--json", store=store).stdout)["every_s"] == 600
    assert run("recurring", "delete", "five", store=store).returncode == 0
    gone = run("recurring", "get", "five", store=store)
    assert gone.returncode == 1 and "no recurring schedule" in gone.stderr


@pytest.mark.parametrize("args,message", [
    (["--cron", "0 3 * * *"], "--kind is required"),
    (["--cron", "0 3 * * 9", "--kind", "k"], "Bad day-of-week"),
    (["--every", "5m", "--kind", "k", "--overlap", "never"], "--overlap 'never' is unknown"),
    (["--every", "5m", "--kind", "k", "--misfire", "later"], "--misfire 'later' is unknown"),
    (["--every", "5m", "--kind", "k", "--catchup-window", "soon"], "not a duration"),
    (["--every", "5m", "--kind", "k", "--payload", "{nope"], "--payload is not valid JSON"),
    (["--every", "5m", "--kind", "k", "--start", "2027-01-02T00:00:00Z", "--end", "2027-01-01T00:00:00Z"],
     "must be after --start"),
])
def test_bad_create_exits_1_and_writes_nothing(store, args, message):
    res = run("recurring", "create", "x", *args, store=store)
    assert res.returncode == 1 and message in res.stderr and res.stderr.count("\n") == 1
    assert json.loads(run("recurring", "list", "--json", store=store).stdout) == []
