"""Hostile environment values: refused by ``Settings.from_env`` with one line naming the
variable, before anything starts (never a ``ValueError`` once the poller has joined)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.domain.address import parse_address
from scheduler.errors import ConfigError, InvalidInput
from scheduler.settings import Settings


@pytest.mark.parametrize("value", ["garbage", "host:", "host:port", "1.2.3.4:65536", "h:-1", "h: 80",
                                   "h:99999999999999999999", "a b:80", "h:\uff18\uff10", "\x1b[31m:80"])
def test_a_malformed_notify_address_is_refused_naming_the_variable(value):
    with pytest.raises(ConfigError) as err:
        Settings.from_env({"SCHEDULER_NOTIFY_ADDRESS": value})
    assert "SCHEDULER_NOTIFY_ADDRESS" in str(err.value) and "HOST:PORT" in str(err.value)
    assert "\n" not in str(err.value) and "\x1b" not in str(err.value)


@pytest.mark.parametrize(("value", "expected"), [
    ("off", None), ("OFF", None), ("", "127.0.0.1:0"), ("0.0.0.0:7000", "0.0.0.0:7000"),
    ("[::1]:0", "[::1]:0"), (":7000", ":7000"), ("host.example:65535", "host.example:65535")])
def test_well_formed_notify_addresses_are_kept(value, expected):
    assert Settings.from_env({"SCHEDULER_NOTIFY_ADDRESS": value}).notify_address == expected


@pytest.mark.parametrize(("value", "expected"), [("on", True), ("off", False), ("true", True),
                                                 ("false", False), ("1", True), ("0", False),
                                                 ("", True), ("OFF", False)])
def test_nudge_is_on_or_off(value, expected):
    assert Settings.from_env({"SCHEDULER_NUDGE": value}).nudge is expected


@pytest.mark.parametrize("value", ["maybe", "2", "offf", "nope"])
def test_nudge_refuses_anything_else(value):
    with pytest.raises(ConfigError, match="SCHEDULER_NUDGE"):
        Settings.from_env({"SCHEDULER_NUDGE": value})


def test_parse_address_reads_hosts_and_ports():
    assert parse_address("[::1]:80") == ("::1", 80)
    assert parse_address(":0") == ("127.0.0.1", 0)
    assert parse_address("example.org:65535") == ("example.org", 65535)


@pytest.mark.fuzz
@given(st.text(max_size=40))
def test_parse_address_raises_only_invalid_input(text):
    try:
        host, port = parse_address(text)
    except InvalidInput:
        return
    assert 0 <= port <= 65535 and host and host.isprintable()


@pytest.mark.fuzz
@given(st.text(max_size=40))
def test_from_env_raises_only_config_error_for_any_notify_address(text):
    try:
        Settings.from_env({"SCHEDULER_NOTIFY_ADDRESS": text, "SCHEDULER_NUDGE": text})
    except ConfigError as exc:
        assert "\n" not in str(exc)


def test_run_refuses_a_malformed_notify_address_before_starting(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env.update(SCHEDULER_NOTIFY_ADDRESS="garbage", SCHEDULER_STORE=f"sqlite:///{tmp_path}/s.db")
    res = subprocess.run([sys.executable, "-m", "scheduler", "run", "--handler", "scheduler:log_job",
                          "--metrics-address", "off"], capture_output=True, text=True, env=env,
                         timeout=60)
    assert res.returncode != 0
    assert "SCHEDULER_NOTIFY_ADDRESS" in res.stderr and "unexpected" not in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "s.db").exists()  # refused before the store was opened
