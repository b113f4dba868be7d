"""Stored or user-given text in the human output of the CLI: shown literally, never read
as rich markup (``a[/]`` used to fail the output after the write, ``[link=...]`` made a
link) and never passed raw to the terminal (an ESC starts a terminal sequence)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import scheduler.cli.main  # noqa: F401  (registers every command)
from scheduler import Client
from scheduler.cli.common import app, cell
from scheduler.store import open_store

ESC_ID = "e\x1b[31mred\x1b]8;;https://evil.example\x07x"
ESC_SHOWN = "e\\x1b[31mred\\x1b]8;;https://evil.example\\x07x"
HOSTILE = {"order-[/]": "order-[/]", "[link=https://evil.example]x[/link]": "[link=https://evil.example]x[/link]",
           "[bold]b": "[bold]b", "tail\\": "tail\\", ESC_ID: ESC_SHOWN}
FUTURE = datetime(2030, 1, 1, tzinfo=UTC)


def cli(url: str, *args: str) -> Any:
    res = CliRunner().invoke(app, list(args), env={"SCHEDULER_STORE": url, "COLUMNS": "400"})
    assert "unexpected" not in res.output, res.output
    return res


def clean(res: Any, shown: str) -> None:
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout
    assert shown in res.stdout, res.stdout


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/s.db"
    assert cli(url, "schema", "apply").exit_code == 0
    return url


def test_cell_escapes_controls_bidi_and_markup() -> None:
    assert cell("a[/]") == "a\\[/]"
    assert cell("x\x1b[2J\u202e\x9b") == "x\\x1b[2J\\u202e\\x9b"
    assert cell(None) == "None"


@pytest.mark.parametrize("job_id", list(HOSTILE))
def test_schedule_reschedule_get_show_a_hostile_id_literally(url: str, job_id: str) -> None:
    shown = HOSTILE[job_id]
    clean(cli(url, "schedule", "--id", job_id, "--at", "2030-01-01T00:00:00Z", "--kind", "k"), shown)
    clean(cli(url, "reschedule", job_id, "--at", "2031-01-01T00:00:00Z"), shown)
    clean(cli(url, "get", job_id), shown)
    raw = cli(url, "get", job_id, "--json")
    assert json.loads(raw.stdout)["job_id"] == job_id  # JSON stays the stored text
    clean(cli(url, "cancel", job_id), shown)
    again = cli(url, "cancel", job_id)
    assert again.exit_code == 1 and "\x1b" not in again.output and "\x07" not in again.output
    assert f"see `scheduler get {shown}`" in again.output


@pytest.mark.parametrize("job_id", list(HOSTILE))
def test_dead_list_and_inspect_show_a_hostile_id_and_error_literally(url: str, job_id: str) -> None:
    store = open_store(url)
    try:
        job = Client(store).schedule(job_id, FUTURE, "k", None)
        store.record_dead(job, f"boom {job_id}", job.fire_ms)
    finally:
        store.close()
    res = cli(url, "dead", "list")
    clean(res, HOSTILE[job_id])
    assert f"boom {HOSTILE[job_id]}" in res.stdout
    clean(cli(url, "inspect", "2030-01-01T00:00:00Z"), HOSTILE[job_id])


@pytest.mark.parametrize("schedule_id", list(HOSTILE))
def test_recurring_list_and_get_show_a_hostile_id_literally(url: str, schedule_id: str) -> None:
    store = open_store(url)
    try:
        Client(store).recurring.create(schedule_id, every=300, kind="k")
    finally:
        store.close()
    clean(cli(url, "recurring", "list"), HOSTILE[schedule_id])
    clean(cli(url, "recurring", "get", schedule_id), HOSTILE[schedule_id])
    clean(cli(url, "recurring", "pause", schedule_id), HOSTILE[schedule_id])
