"""``scheduler limits set|get|list|clear`` and ``scheduler kinds pause|resume`` on the
embedded store: the six JSON keys, partial updates, one line and exit 1 with nothing
written for every bad value, the old-schema message, and a fuzz of ``--rate``. In process
(a subprocess costs about a second); one test runs the real command."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import scheduler.cli.main  # noqa: F401  (registers every command)
from scheduler.cli.common import app
from scheduler.domain.flow import MAX_LIMIT, MIN_RATE_PER_S, Limits, format_rate, parse_rate
from scheduler.errors import InvalidInput
from scheduler.store import SchemaOptions, open_store
from tests.conftest import sqlite_dump as dump
from tests.unit.test_cli import run

KEYS = {"kind", "rate_per_s", "burst", "concurrency", "per_key_concurrency", "paused"}
BAD_RATES = ["0/s", "-1/s", "0.0/m", "5/d", "5", "abc", "", " ", "1/", "/s", "5/sec", "nan/s", "inf/s",
             "1e999/s", "1_000/s", "\u0663/s", "0x10/s", "1/s/s", "2e9/s", "1/h/2", "0.00001/h"]
BAD_COUNTS = ["0", "-1", "1.5", "abc", "", " ", "1e3", "99999999999", "1000000001", "\u0663", "+", "true"]
BAD_KINDS = ["", "bad kind", "x" * 65, "a\nb", "\u00e9t\u00e9", "1st", ".x", "a/b", "<b>"]


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/flow.db"
    assert cli(url, "schema", "apply").exit_code == 0
    return url


def cli(url: str, *args: str) -> Any:
    return CliRunner().invoke(app, list(args), env={"SCHEDULER_STORE": url, "COLUMNS": "200"})


def ok_json(url: str, *args: str) -> Any:
    res = cli(url, *args, "--json")
    assert res.exit_code == 0 and res.stderr == "", res.output
    return json.loads(res.stdout)


def limits(url: str) -> list[Limits]:
    st = open_store(url, create=False)
    try:
        return st.flow_limits()
    finally:
        st.close()


def one_line_error(res: Any, *words: str) -> None:
    assert res.exit_code == 1, res.output
    assert res.stdout == "" and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith("error: ") and "Traceback" not in res.stderr
    assert "unexpected" not in res.stderr
    for w in words:
        assert w in res.stderr, res.stderr


def test_set_changes_only_the_limits_given_and_get_shows_the_six_keys(store):
    out = ok_json(store, "limits", "set", "email", "--rate", "30/m", "--burst", "5")
    assert out == {"kind": "email", "rate_per_s": 0.5, "burst": 5, "concurrency": None,
                   "per_key_concurrency": None, "paused": False}
    ok_json(store, "limits", "set", "email", "--concurrency", "8", "--per-key-concurrency", "2")
    got = ok_json(store, "limits", "get", "email")
    assert set(got) == KEYS
    assert got == {"kind": "email", "rate_per_s": 0.5, "burst": 5, "concurrency": 8,
                   "per_key_concurrency": 2, "paused": False}
    # A burst alone keeps the stored rate: it needs one, and there is one.
    assert ok_json(store, "limits", "set", "email", "--burst", "9")["burst"] == 9
    assert limits(store) == [Limits("email", 0.5, 9, 8, 2)]
    text = cli(store, "limits", "get", "email")
    assert text.exit_code == 0
    assert any(line.split("\u2502")[1:-1] == [" email ", " 30/m ", "     9 ", "           8 ", "       2 ",
                                              " no     "] for line in text.stdout.splitlines()), text.stdout


def test_get_of_a_kind_with_nothing_set_is_all_null_and_not_paused(store):
    got = ok_json(store, "limits", "get", "never-set")
    assert got == {"kind": "never-set", "rate_per_s": None, "burst": None, "concurrency": None,
                   "per_key_concurrency": None, "paused": False}
    assert cli(store, "limits", "get", "never-set").exit_code == 0
    assert limits(store) == []


def test_list_is_a_json_list_of_the_same_objects_by_kind(store):
    assert ok_json(store, "limits", "list") == []
    ok_json(store, "limits", "set", "sms", "--rate", "2/s")
    ok_json(store, "kinds", "pause", "email")
    listed = ok_json(store, "limits", "list")
    assert [o["kind"] for o in listed] == ["email", "sms"] and all(set(o) == KEYS for o in listed)
    assert listed == [ok_json(store, "limits", "get", "email"), ok_json(store, "limits", "get", "sms")]
    text = cli(store, "limits", "list").stdout
    assert "2 kinds with limits or a pause" in text and "2/s" in text and "paused" in text


def test_clear_keeps_a_pause_and_pause_resume_keep_the_limits(store):
    ok_json(store, "limits", "set", "email", "--rate", "100/s", "--concurrency", "4")
    res = cli(store, "kinds", "pause", "email")
    assert res.exit_code == 0 and res.stdout.count("\n") == 1 and res.stdout.startswith("paused email")
    assert limits(store) == [Limits("email", 100.0, None, 4, None, True)]
    res = cli(store, "limits", "clear", "email")
    assert res.exit_code == 0 and "stays paused" in res.stdout and res.stdout.count("\n") == 1
    assert limits(store) == [Limits("email", paused=True)]
    ok_json(store, "limits", "set", "email", "--rate", "1/h")
    res = cli(store, "kinds", "resume", "email")
    assert res.exit_code == 0 and res.stdout.count("\n") == 1 and res.stdout.startswith("resumed email")
    assert limits(store) == [Limits("email", 1 / 3600)]
    assert cli(store, "kinds", "resume", "email").exit_code == 0  # idempotent
    res = cli(store, "limits", "clear", "email")
    assert res.exit_code == 0 and res.stdout == "cleared the limits of email\n"
    assert limits(store) == []
    assert cli(store, "limits", "clear", "email").exit_code == 0  # idempotent


def test_set_without_a_limit_says_what_to_give_and_writes_nothing(store):
    before = dump(store)
    one_line_error(cli(store, "limits", "set", "email"), "--rate", "--burst", "--concurrency",
                   "--per-key-concurrency")
    assert dump(store) == before


BAD_ARGS: list[tuple[list[str], str]] = [
    *[(["limits", "set", "email", "--rate", bad], "rate") for bad in BAD_RATES],
    *[(["limits", "set", "email", "--rate", "5/s", flag, bad], name)
      for bad in BAD_COUNTS for flag, name in [("--burst", "burst"), ("--concurrency", "concurrency"),
                                               ("--per-key-concurrency", "per_key_concurrency")]],
    *[([*cmd, bad, *more], "kind") for bad in BAD_KINDS
      for cmd, more in [(["limits", "set"], ["--rate", "5/s"]), (["limits", "get"], []),
                        (["limits", "clear"], []), (["kinds", "pause"], []), (["kinds", "resume"], [])]],
    (["limits", "set", "fresh", "--burst", "5"], "needs a rate"),
]


def test_a_bad_value_is_one_line_exit_1_and_writes_nothing(store):
    # A state to keep: limits on one kind, a pause on another. One store for every case.
    ok_json(store, "limits", "set", "email", "--rate", "3/s", "--burst", "4")
    ok_json(store, "kinds", "pause", "sms")
    before, rows = dump(store), limits(store)
    for args, says in BAD_ARGS:
        one_line_error(cli(store, *args), says)
        assert dump(store) == before and limits(store) == rows, args


def test_a_store_before_the_flow_tables_names_schema_apply(tmp_path):
    url = f"sqlite:///{tmp_path}/v5.db"
    st = open_store(url, create=True)
    try:
        st.apply_schema(SchemaOptions(shard_count=4, upto=5), 1_800_000_000_000)
    finally:
        st.close()
    before = dump(url)
    for args in (["limits", "set", "email", "--rate", "1/s"], ["limits", "get", "email"], ["limits", "list"],
                 ["limits", "clear", "email"], ["kinds", "pause", "email"], ["kinds", "resume", "email"]):
        one_line_error(cli(url, *args), "scheduler schema apply")
    assert dump(url) == before


def test_the_real_command(store):
    """Once as a user runs it: a process, its streams and exit codes."""
    res = run("limits", "set", "email", "--rate", "100/s", "--per-key-concurrency", "2", store=store)
    assert res.returncode == 0 and res.stderr == "" and res.stdout.startswith("limits of email: rate 100/s")
    got = run("limits", "get", "email", "--json", store=store)
    assert got.returncode == 0 and json.loads(got.stdout)["per_key_concurrency"] == 2
    bad = run("limits", "set", "email", "--rate", "0/s", store=store)
    assert bad.returncode == 1 and bad.stdout == "" and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith("error: rate 0/s must be above 0")


@pytest.mark.fuzz
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(max_size=30),
                      st.builds(lambda n, u: f"{n}/{u}", st.text("0123456789.-+eE", max_size=12),
                                st.sampled_from(["s", "m", "h", "d", "", "S"]))))
def test_any_rate_text_is_set_as_a_positive_finite_rate_or_one_line_exit_1(store, text):
    before = limits(store)
    res = cli(store, "limits", "set", "email", f"--rate={text}", "--json")
    if res.exit_code == 0:
        rate = json.loads(res.stdout)["rate_per_s"]
        assert isinstance(rate, float) and math.isfinite(rate) and rate > 0
        assert rate == parse_rate(text) and [r.rate_per_s for r in limits(store)] == [rate]
    else:
        one_line_error(res)
        assert limits(store) == before


@pytest.mark.fuzz
@given(st.floats(min_value=MIN_RATE_PER_S, max_value=MAX_LIMIT))
def test_a_shown_rate_reads_back_as_the_same_rate(rate):
    text = format_rate(rate)
    number, unit = text.split("/")
    assert unit in "smh" and (float(number) >= 1 - 1e-9 or unit == "h")
    assert math.isclose(parse_rate(text), rate, rel_tol=1e-9)


def test_shown_rates():
    given = ("100/s", "2.5/s", "30/m", "0.5/s", "1/m", "7/m", "1/h", "59/m")
    assert [format_rate(parse_rate(t)) for t in given] == [
        "100/s", "2.5/s", "30/m", "30/m", "1/m", "7/m", "1/h", "59/m"]
    with pytest.raises(InvalidInput):
        parse_rate(format_rate(MIN_RATE_PER_S / 2))
