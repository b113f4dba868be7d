"""A job's priority and key from the outside: ``schedule --priority --key``, ``get``,
the JSON-lines fields of ``load``, ``recurring create``, and hostile values refused with
one line, exit 1 and nothing written (on the embedded store: the real CLI in a subprocess
once, the many hostile values in process)."""

from __future__ import annotations

import json
import unicodedata
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import scheduler.cli.main  # noqa: F401  (registers every command)
from scheduler import Job
from scheduler.cli.common import app
from scheduler.domain.flow import DEFAULT_PRIORITY, MAX_KEY_BYTES, check_key, parse_priority
from scheduler.domain.jobspec import JobSpec, spec_from_dict
from scheduler.errors import InvalidInput
from tests.conftest import sqlite_dump as dump
from tests.unit.test_cli import run

AT = "2030-01-01T09:00:00Z"
BASE = {"id": "a", "at": AT, "kind": "k"}
BAD_PRIORITIES = ["10", "-1", "x", "5.0", "", " ", "\u0665", "99999999999999999999"]
BAD_KEYS = ["", "x" * (MAX_KEY_BYTES + 1), "é" * 129, "a\nb", "tab\there", "\x1b[31mred"]
BAD_RECORD_FIELDS: list[dict[str, object]] = [
    {"priority": 10}, {"priority": -1}, {"priority": True}, {"priority": "5"}, {"priority": 5.0},
    {"priority": None}, {"priority": 2**70}, {"key": ""}, {"key": "x" * 257}, {"key": 42},
    {"key": ["a"]}, {"key": "a\u0000b"}]


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/pk.db"
    assert run("schema", "apply", store=url).returncode == 0
    return url


def cli(url: str, *args: str, stdin: str | None = None) -> Any:
    """The command in process (a subprocess per hostile value would take a second each)."""
    return CliRunner().invoke(app, list(args), input=stdin, env={"SCHEDULER_STORE": url, "COLUMNS": "400"})


def one_line_error(res: Any, *words: str) -> None:
    assert res.exit_code == 1, res.output
    assert res.stdout == "" and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith("error: ") and "Traceback" not in res.stderr
    assert "unexpected" not in res.stderr
    for w in words:
        assert w in res.stderr, res.stderr


def test_the_defaults_agree():
    # domain.model cannot import domain.flow (flow imports model): the value is repeated.
    spec = JobSpec("a", datetime.now(UTC), "k")
    assert Job._field_defaults["priority"] == DEFAULT_PRIORITY == spec.priority == 5


def test_schedule_and_get_show_priority_and_key(store):
    res = run("schedule", "--id", "a", "--at", AT, "--kind", "k", "--priority", "9", "--key", "customer-42",
              "--json", store=store)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert (out["priority"], out["key"]) == (9, "customer-42")
    got = json.loads(run("get", "a", "--json", store=store).stdout)
    assert (got["priority"], got["key"]) == (9, "customer-42")
    text = run("get", "a", store=store).stdout
    assert any(line.split() == ["priority", "9"] for line in text.splitlines())
    assert any(line.split() == ["key", "customer-42"] for line in text.splitlines())
    assert run("schedule", "--id", "b", "--at", AT, "--kind", "k", store=store).returncode == 0
    got = json.loads(run("get", "b", "--json", store=store).stdout)
    assert (got["priority"], got["key"]) == (5, None)


def test_bad_priority_or_key_on_the_command_line_writes_nothing(store):
    before = dump(store)
    for bad in BAD_PRIORITIES:
        one_line_error(cli(store, "schedule", "--id", "x", "--at", AT, "--kind", "k", "--priority", bad),
                       "priority")
    for bad in BAD_KEYS:
        one_line_error(cli(store, "schedule", "--id", "x", "--at", AT, "--kind", "k", "--key", bad), "key")
    assert dump(store) == before


def test_load_takes_priority_and_key(store):
    lines = [json.dumps({**BASE, "id": "p", "priority": 0, "key": "bulk"}),
             json.dumps({**BASE, "id": "q", "key": None}), json.dumps({**BASE, "id": "r", "priority": 9})]
    res = cli(store, "load", "-", "--json", stdin="\n".join(lines) + "\n")
    assert res.exit_code == 0 and json.loads(res.stdout) == {"loaded": 3}, res.output
    got = {j: json.loads(cli(store, "get", j, "--json").stdout) for j in "pqr"}
    assert [(g["priority"], g["key"]) for g in got.values()] == [(0, "bulk"), (5, None), (9, None)]


def test_load_with_a_bad_priority_or_key_writes_nothing(store):
    before = dump(store)
    for bad in BAD_RECORD_FIELDS:
        lines = [json.dumps({**BASE, "id": "ok"}), json.dumps({**BASE, "id": "bad", **bad})]
        one_line_error(cli(store, "load", "-", stdin="\n".join(lines) + "\n"), "job #2")
    assert dump(store) == before


def test_recurring_create_takes_priority_and_key(store):
    res = cli(store, "recurring", "create", "s1", "--every", "1h", "--kind", "k", "--priority", "2",
              "--key", "acct", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert (out["priority"], out["key"]) == (2, "acct")
    before = dump(store)
    one_line_error(cli(store, "recurring", "create", "s2", "--every", "1h", "--kind", "k",
                       "--priority", "10"), "priority")
    one_line_error(cli(store, "recurring", "update", "s1", "--key", ""), "key")
    assert dump(store) == before


@pytest.mark.parametrize("bad", BAD_RECORD_FIELDS, ids=repr)
def test_a_record_with_a_bad_priority_or_key_names_the_job(bad):
    with pytest.raises(InvalidInput, match=r"^job #4: (priority|key) "):
        spec_from_dict({**BASE, **bad}, 3)


def test_a_record_takes_priority_and_key():
    spec = spec_from_dict({**BASE, "priority": 0, "key": "c-1"}, 0)
    assert (spec.priority, spec.key) == (0, "c-1")
    assert (spec_from_dict(BASE, 0).priority, spec_from_dict(BASE, 0).key) == (5, None)


JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                        st.text(max_size=300), st.lists(st.integers(), max_size=2))


@pytest.mark.fuzz
@given(priority=JSON_VALUES, key=JSON_VALUES)
def test_any_priority_and_key_in_a_record_raise_only_invalid_input(priority, key):
    try:
        spec = spec_from_dict({**BASE, "priority": priority, "key": key}, 0)
    except InvalidInput as exc:
        assert "\n" not in str(exc)
        return
    assert type(spec.priority) is int and 0 <= spec.priority <= 9
    assert spec.key is None or (0 < len(spec.key.encode("utf-8")) <= MAX_KEY_BYTES
                                and not any(unicodedata.category(c) == "Cc" for c in spec.key))


@pytest.mark.fuzz
@given(st.text(max_size=40))
def test_any_priority_text_raises_only_invalid_input(text):
    try:
        level = parse_priority(text)
    except InvalidInput as exc:
        assert "\n" not in str(exc)
        return
    assert level in range(10) and text.strip() == str(level)


@pytest.mark.fuzz
@given(st.text(max_size=300))
def test_any_key_text_raises_only_invalid_input(text):
    try:
        key = check_key(text)
    except InvalidInput as exc:
        assert "\n" not in str(exc)
        return
    assert key == text and 0 < len(text.encode("utf-8")) <= MAX_KEY_BYTES
