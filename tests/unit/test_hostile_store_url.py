"""Store URLs holding control characters are refused for every scheme, with one line
that shows the URL escaped, and no file is created."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.errors import ConfigError
from scheduler.store import check_store_url, open_store

CONTROLS = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))]


@pytest.mark.parametrize("control", CONTROLS)
@pytest.mark.parametrize("template", ["sqlite://{}red.db", "sqlite:///tmp/a{}b.db",
                                      "cassandra://127.0.0.1/ks{}", "cassandra://h{}ost/ks"])
def test_a_control_character_is_refused_in_every_known_scheme(template, control):
    url = template.format(control)
    with pytest.raises(ConfigError, match="control character") as err:
        check_store_url(url)
    message = str(err.value)
    assert message.isprintable() and repr(control)[1:-1] in message  # shown escaped


def test_an_unknown_scheme_with_a_control_character_is_not_echoed():
    with pytest.raises(ConfigError, match="control character") as err:
        check_store_url("postgres://user:secret\x1b@h/db")
    assert "secret" not in str(err.value)


def test_open_store_creates_no_file_for_such_a_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError):
        open_store("sqlite://\x1b[31mred.db", create=True)
    assert list(tmp_path.iterdir()) == []


def test_schema_apply_refuses_it_in_one_line(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    res = subprocess.run([sys.executable, "-m", "scheduler", "schema", "apply", "--store",
                          "sqlite://\x1b[31mred.db"], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=60)
    assert res.returncode == 1 and "control character" in res.stderr, res.stderr
    assert "\x1b" not in res.stderr and "\\x1b" in res.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.fuzz
@given(st.sampled_from(["sqlite://", "sqlite:///", "cassandra://", "other://", ""]),
       st.text(max_size=30), st.sampled_from(CONTROLS), st.text(max_size=10))
def test_any_url_with_a_control_character_raises_only_config_error(prefix, before, control, after):
    with pytest.raises(ConfigError) as err:
        check_store_url(prefix + before + control + after)
    assert "\n" not in str(err.value)
