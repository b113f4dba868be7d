"""What the package says it is, in each place a reader first meets it: the package's
metadata, the CLI's top-level help and the README's first lines. It schedules one-shot
jobs and recurring ones (``scheduler recurring``)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from typer.testing import CliRunner

import scheduler.cli.main  # noqa: F401  (registers every command)
from scheduler.cli.common import app

ROOT = Path(__file__).resolve().parents[2]
WHAT = "one-shot and recurring jobs"


def test_the_package_description_names_recurring_jobs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert WHAT in project["description"]


def test_the_cli_help_names_recurring_jobs():
    res = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert WHAT in " ".join(res.output.split())


def test_the_readme_opens_with_recurring_jobs():
    first = (ROOT / "README.md").read_text().split("\n\n")[1]
    assert WHAT in " ".join(first.split())
