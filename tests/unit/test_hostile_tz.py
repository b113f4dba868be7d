"""An empty time zone given explicitly is refused, not read as UTC."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.errors import InvalidInput
from scheduler.recurring.rule import Rule


@pytest.mark.parametrize("kwargs", [{"cron": "@daily"}, {"every": "5m"}])
def test_an_empty_zone_is_refused(kwargs):
    with pytest.raises(InvalidInput, match="--tz is empty"):
        Rule.parse(**kwargs, tz="")


def test_no_zone_is_utc():
    assert Rule.parse(cron="@daily").tz == "UTC"
    assert Rule.parse(every="5m", tz=None).tz == "UTC"


def test_recurring_create_refuses_an_empty_tz(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env["SCHEDULER_STORE"] = f"sqlite:///{tmp_path}/s.db"
    run = [sys.executable, "-m", "scheduler"]
    assert subprocess.run([*run, "schema", "apply"], env=env, capture_output=True, timeout=60).returncode == 0
    res = subprocess.run([*run, "recurring", "create", "daily", "--kind", "k", "--cron", "@daily",
                          "--tz", ""],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "--tz is empty" in res.stderr, res.stderr
    listed = subprocess.run([*run, "recurring", "list", "--json"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert "daily" not in listed.stdout
