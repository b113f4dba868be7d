"""JSON-lines records of ``scheduler load``: a name and its alias given together, or a
time that is not a string, are refused naming the job, and nothing is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.domain.jobspec import ALIASES, spec_from_dict
from scheduler.errors import InvalidInput

BASE = {"id": "a", "at": "2030-01-01T00:00:00Z", "kind": "k"}


@pytest.mark.parametrize(("alias", "name"), ALIASES)
def test_a_name_and_its_alias_together_are_refused(alias, name):
    values = {"id": "a", "job_id": "a", "at": BASE["at"], "due_at": BASE["at"], "jitter": 1,
              "jitter_s": 1}
    raw = {**BASE, alias: values[alias], name: values[name]}
    with pytest.raises(InvalidInput, match=rf"^job #3: both {alias} and {name} given"):
        spec_from_dict(raw, 2)


@pytest.mark.parametrize("field", ["at", "due_at"])
@pytest.mark.parametrize("value", [12345, 1.5, True, ["2030-01-01T00:00:00Z"], {"t": 1}])
def test_a_time_that_is_not_a_string_says_so(field, value):
    raw = {"id": "a", "kind": "k", field: value}
    with pytest.raises(InvalidInput, match=rf"^job #1: {field} must be a string \(an RFC 3339 time"):
        spec_from_dict(raw, 0)


def test_a_missing_time_is_still_missing():
    with pytest.raises(InvalidInput, match="missing due_at"):
        spec_from_dict({"id": "a", "kind": "k"}, 0)
    with pytest.raises(InvalidInput, match="missing due_at"):
        spec_from_dict({"id": "a", "kind": "k", "at": None}, 0)


@pytest.mark.parametrize(("alias", "name"), ALIASES)
def test_either_name_alone_is_accepted(alias, name):
    for key in (alias, name):
        raw: dict[str, object] = {k: v for k, v in BASE.items() if k not in (alias, name)}
        raw[key] = {"id": "x", "job_id": "x", "at": BASE["at"], "due_at": BASE["at"],
                    "jitter": 2, "jitter_s": 2}[key]
        spec = spec_from_dict(raw, 0)
        assert spec.kind == "k"


JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                        st.text(max_size=30), st.sampled_from(["2030-01-01T00:00:00Z", "x"]))


@pytest.mark.fuzz
@given(st.dictionaries(st.sampled_from(["id", "job_id", "at", "due_at", "jitter", "jitter_s", "kind"]),
                       JSON_VALUES, max_size=7))
def test_any_record_raises_only_invalid_input_and_never_takes_both_names(raw):
    both = any(a in raw and n in raw for a, n in ALIASES)
    try:
        spec_from_dict(raw, 0)
    except InvalidInput as exc:
        assert "\n" not in str(exc)
        return
    assert not both


def test_load_writes_nothing_when_a_line_gives_both_names(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env["SCHEDULER_STORE"] = f"sqlite:///{tmp_path}/s.db"

    def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "scheduler", *args], capture_output=True,
                              text=True, env=env, input=stdin, timeout=60)

    assert cli("schema", "apply").returncode == 0
    lines = [json.dumps({**BASE, "id": "ok"}),
             json.dumps({**BASE, "id": "b", "due_at": "2031-01-01T00:00:00Z"})]
    res = cli("load", "-", stdin="\n".join(lines) + "\n")
    assert res.returncode == 1 and "job #2: both at and due_at given" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert cli("get", "ok").returncode != 0  # the valid first line was not written either
