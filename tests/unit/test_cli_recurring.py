"""``scheduler recurring preview`` in a subprocess: the fixed CLI contract."""

from __future__ import annotations

import json

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
