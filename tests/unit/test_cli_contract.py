"""Every command against the error contract of docs/CLI.md, on the embedded store.

The commands are found by walking the command tree, so a new command is checked (and
must be placed in the docs' store table) without anyone remembering to. Each runs
in-process through the real root command (``ContractGroup.main``) with bad input; a few
run as subprocesses to see the real streams.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command

import scheduler.cli.main  # noqa: F401  (registers every command)
from scheduler.cli.common import app
from scheduler.logs import CHATTY
from tests.conftest import sqlite_dump as dump

ROOT = get_command(app)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "CLI.md"
PAST, PAST2 = "2025-01-01T00:00:00Z", "2025-01-01T01:00:00Z"
FUTURE = "2030-01-01T00:00:00Z"
# A value for each required parameter, by its name in the command function.
SAMPLES = {"job_id": "j1", "at": FUTURE, "kind": "k", "bucket": FUTURE, "schedule_id": "s1",
           "count": "32", "from_": PAST, "to": PAST2}
# What some commands need besides their required parameters to get past their own checks.
EXTRA = {
    ("run",): ["--handler", "tests.handlers:record", "--metrics-address", "off"],
    ("recurring", "create"): ["--every", "5m", "--kind", "k"],
    ("recurring", "update"): ["--every", "5m"],
    ("console",): ["--address", "127.0.0.1:0"],
    ("api",): ["--address", "127.0.0.1:0"],
    ("dead", "replay"): ["--all"],
}
# Options named like durations that are not durations, and why.
NOT_DURATIONS = {(("forecast",), "--hours"): "a number of hours"}
DURATION_WORDS = re.compile(r"timeout|interval|delay|jitter|retention|lookback|window|every|seconds")


def leaves(cmd: Any = ROOT, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    subs = getattr(cmd, "commands", None)
    if subs is None:
        yield path, cmd
        return
    for name, sub in sorted(subs.items()):
        yield from leaves(sub, (*path, name))


COMMANDS = dict(leaves())
IDS = [" ".join(p) for p in COMMANDS]


def options(cmd: Any) -> list[Any]:
    return [p for p in cmd.params if getattr(p, "opts", None) and p.opts[0].startswith("--")]


def store_table() -> dict[str, str]:
    """docs/CLI.md's store table: command -> creates | writes | reads | none."""
    text = DOCS.read_text().split("## Stores", 1)[1].split("\n## ", 1)[0]
    out = {}
    for row in re.findall(r"^\| (`.+?) \| (\w+) \|$", text, re.M):
        for name in re.findall(r"`([^`]+)`", row[0]):
            out[name] = row[1]
    return out


def exit_codes() -> list[int]:
    text = DOCS.read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    return [int(c) for c in re.findall(r"^\| (\d+) \|", text, re.M)]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key in list(os.environ):
        if key.startswith("SCHEDULER_"):
            monkeypatch.delenv(key)
    # run, exporter and console set up logging for a process: put it back afterwards.
    names = ["scheduler", *CHATTY]
    saved = [(lg, lg.handlers[:], lg.level, lg.propagate) for lg in map(logging.getLogger, names)]
    path = sys.path[:]
    yield
    for lg, handlers, level, propagate in saved:
        lg.handlers[:], lg.propagate = handlers, propagate
        lg.setLevel(level)
    sys.path[:] = path


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('good') / 'c.db'}"
    assert ROOT.main(["schema", "apply", "--store", url], "scheduler", standalone_mode=False) == 0
    return url


def invoke(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str, str]:
    code = ROOT.main(args, "scheduler", standalone_mode=False)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, err
    return code, out, err


def runtime_error(res: tuple[int, str, str], *says: str) -> None:
    code, out, err = res
    assert code == 1 and out == "", (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for word in says:
        assert word in lines[0], lines[0]


def usage_error(res: tuple[int, str, str], says: str) -> None:
    code, out, err = res
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith("Usage: scheduler") and f"Error: {says}" in err, err


def valid_args(path: tuple[str, ...], cmd: Any, tmp: Path) -> list[str]:
    """The command with every required parameter given a valid value."""
    args = [*path]
    for p in cmd.params:
        if not p.required:
            continue
        if p.name == "file":
            jobs = tmp / "jobs.jsonl"
            jobs.write_text('{"id": "l1", "at": "2030-01-01T00:00:00Z", "kind": "k"}\n')
            value = str(jobs)
        else:
            assert p.name in SAMPLES, f"{' '.join(path)}: add a sample value for {p.name} to SAMPLES"
            value = SAMPLES[p.name]
        args += [value] if not getattr(p, "opts", [""])[0].startswith("-") else [p.opts[0], value]
    return args + EXTRA.get(path, [])


def test_docs_list_each_exit_code_once_and_place_every_command():
    codes = exit_codes()
    assert sorted(codes) == [0, 1, 2, 3, 4, 5, 130, 143] and len(codes) == len(set(codes))
    table = store_table()
    assert set(table) == set(IDS), "docs/CLI.md's store table and the command tree differ"
    for path, cmd in COMMANDS.items():
        has_store = any(p.name == "store" for p in cmd.params)
        assert has_store == (table[" ".join(path)] != "none"), path


@pytest.mark.parametrize("path", COMMANDS, ids=IDS)
def test_an_unknown_option_is_a_usage_error(path, capsys):
    usage_error(invoke(capsys, [*path, "--no-such-option"]), "No such option: --no-such-option")


@pytest.mark.parametrize("path", [p for p, c in COMMANDS.items() if any(x.required for x in c.params)],
                         ids=[i for i, c in zip(IDS, COMMANDS.values(), strict=True)
                              if any(x.required for x in c.params)])
def test_a_missing_required_parameter_is_a_usage_error(path, capsys):
    usage_error(invoke(capsys, [*path]), "Missing")


@pytest.mark.parametrize("path", [p for p in COMMANDS if store_table()[" ".join(p)] in ("reads", "writes")],
                         ids=[i for i in IDS if store_table()[i] in ("reads", "writes")])
def test_a_store_that_does_not_exist_is_one_line_and_is_not_created(path, capsys, tmp_path):
    args = valid_args(path, COMMANDS[path], tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    runtime_error(invoke(capsys, [*args, "--store", f"sqlite:///{empty}/missing.db"]))
    assert list(empty.iterdir()) == []


@pytest.mark.parametrize("path", [p for p in COMMANDS if store_table()[" ".join(p)] != "none"],
                         ids=[i for i in IDS if store_table()[i] != "none"])
@pytest.mark.parametrize("url", ["sqlite:{dir}/x.db", "sqlite://", "redis://{dir}/x", "cassandra://[::1/ks",
                                 "cassandra://h:99999/ks"])
def test_a_malformed_store_url_is_one_line(path, url, capsys, tmp_path):
    args = valid_args(path, COMMANDS[path], tmp_path)
    before = sorted(tmp_path.rglob("*"))
    runtime_error(invoke(capsys, [*args, "--store", url.format(dir=tmp_path)]), "store URL")
    assert sorted(tmp_path.rglob("*")) == before


DURATION_CASES = [(p, o.opts[0]) for p, c in COMMANDS.items() for o in options(c) if o.metavar == "DURATION"]


def test_every_duration_flag_reads_the_duration_syntax():
    named = {(p, o.opts[0]) for p, c in COMMANDS.items() for o in options(c)
             if DURATION_WORDS.search(o.opts[0])}
    assert named - set(NOT_DURATIONS) <= set(DURATION_CASES)
    assert not set(NOT_DURATIONS) & set(DURATION_CASES), "a listed exception reads durations now: drop it"
    assert len(DURATION_CASES) >= 15


@pytest.mark.parametrize("path,flag", DURATION_CASES, ids=[f"{' '.join(p)} {f}" for p, f in DURATION_CASES])
@pytest.mark.parametrize("value", ["10 parsecs", "-5s", "1e3", "nan"])
def test_a_bad_duration_is_one_line_and_writes_nothing(path, flag, value, store, capsys, tmp_path):
    args = valid_args(path, COMMANDS[path], tmp_path)
    before = dump(store)
    store_opt = ["--store", store] if store_table()[" ".join(path)] != "none" else []
    runtime_error(invoke(capsys, [*args, flag, value, *store_opt]), flag, "not a duration")
    assert dump(store) == before


TIME_CASES = [(p, o.opts[0]) for p, c in COMMANDS.items() for o in options(c) if o.metavar == "TIME"]


@pytest.mark.parametrize("path,flag", TIME_CASES, ids=[f"{' '.join(p)} {f}" for p, f in TIME_CASES])
@pytest.mark.parametrize("value", ["next tuesday", "2030-01-01T00:00:00", "0001-01-01T00:00:00+01:00"])
def test_a_bad_time_is_one_line_and_writes_nothing(path, flag, value, store, capsys, tmp_path):
    args = valid_args(path, COMMANDS[path], tmp_path)
    before = dump(store)
    store_opt = ["--store", store] if store_table()[" ".join(path)] != "none" else []
    runtime_error(invoke(capsys, [*args, flag, value, *store_opt]), "time")
    assert dump(store) == before


COORD_CASES = [p for p, c in COMMANDS.items() if any(o.opts[0] == "--coordinator" for o in options(c))]


@pytest.mark.parametrize("path", COORD_CASES, ids=[" ".join(p) for p in COORD_CASES])
@pytest.mark.parametrize("url", ["zookeeper:/x", "localhost:2181", "zookeeper://h:99999/x",
                                 "zookeeper://h/a//b", "zookeeper://u:secret@h/x"])
def test_a_malformed_coordinator_url_is_one_line(path, url, store, capsys, tmp_path):
    args = valid_args(path, COMMANDS[path], tmp_path)
    # `shards home` reads only ZooKeeper: it has no --store
    has_store = any(o.opts[0] == "--store" for o in options(COMMANDS[path]))
    code, out, err = invoke(capsys, [*args, "--coordinator", url, *(["--store", store] if has_store else [])])
    runtime_error((code, out, err), "coordinator")
    assert "secret" not in err


INT_CASES = [(p, o.opts[0]) for p, c in COMMANDS.items() for o in options(c)
             if getattr(o.type_descriptor, "annotation", None) is int]


@pytest.mark.parametrize("path,flag", INT_CASES, ids=[f"{' '.join(p)} {f}" for p, f in INT_CASES])
def test_a_number_that_is_not_one_is_a_usage_error(path, flag, capsys, tmp_path):
    usage_error(invoke(capsys, [*valid_args(path, COMMANDS[path], tmp_path), flag, "abc"]), "Invalid value")


def test_version(capsys):
    from scheduler import __version__

    code, out, err = invoke(capsys, ["--version"])
    assert code == 0 and out == f"scheduler {__version__}\n" and err == ""


def test_version_without_an_installed_distribution(monkeypatch):
    import importlib.metadata

    from scheduler import __version__
    from scheduler.cli.common import version

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert version() == __version__


def test_an_unexpected_error_is_one_line_and_the_traceback_only_on_request(capsys, monkeypatch):
    import scheduler.cli.common as common

    def boom(store: Any) -> Any:
        raise RuntimeError("something\nnobody foresaw")

    monkeypatch.setattr(common, "client_for", boom)
    monkeypatch.setattr("scheduler.cli.main.client_for", boom)
    runtime_error(invoke(capsys, ["reschedule", "x", "--at", FUTURE]),
                  "unexpected RuntimeError: something nobody foresaw", "SCHEDULER_DEBUG=1")
    monkeypatch.setenv("SCHEDULER_DEBUG", "1")
    assert ROOT.main(["reschedule", "x", "--at", FUTURE], "scheduler", standalone_mode=False) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.splitlines()[-1].startswith("error: unexpected RuntimeError")


def test_ctrl_c_exits_130(capsys, monkeypatch):
    def interrupted(store: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr("scheduler.cli.main.client_for", interrupted)
    code, out, _ = invoke(capsys, ["reschedule", "x", "--at", FUTURE])
    assert code == 130 and out == ""


@pytest.mark.parametrize("args,says", [
    (["lag", "--top", "-1"], "--top -1 must be at least 1"),
    (["lag", "--top", "0"], "--top 0 must be at least 1"),
    (["run", "--max-rate", "nan", "--shards", "0", *EXTRA[("run",)]], "--max-rate nan must be"),
    (["run", "--max-shard-rate", "-1", "--shards", "0", *EXTRA[("run",)]], "--max-shard-rate -1.0 must be"),
    (["cancel", "nope"], "no pending job 'nope' to cancel"),
    (["schema", "apply", "--shards", "32"], "--shards 32 applies only to a new store"),
    (["schema", "apply", "--bucket-width", "10"], "--bucket-width 10 applies only to a new store"),
    (["run", "--shards", "0-99", *EXTRA[("run",)]], "shards 16-99 do not exist"),
    (["recurring", "create", "r", "--every", "5m", "--kind", "k", "--end", "2025-01-01T00:00:00Z"],
     "--end 2025-01-01T00:00:00+00:00 is in the past"),
    (["refire", "--from", PAST, "--to", FUTURE], "is in the future"),
])
def test_input_once_accepted_silently_is_refused(args, says, store, capsys):
    before = dump(store)
    runtime_error(invoke(capsys, [*args, "--store", store]), says)
    assert dump(store) == before


def test_schema_apply_with_the_same_count_is_still_a_no_op(store, capsys):
    code, out, err = invoke(capsys, ["schema", "apply", "--shards", "16", "--bucket-width", "60",
                                     "--store", store])
    assert code == 0 and "already current" in out, err


def run_real(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    return subprocess.run([sys.executable, "-m", "scheduler", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_the_real_streams(tmp_path):
    """A few runs as a user sees them: stderr and stdout apart, exit codes from the process."""
    missing = run_real("get", "x", "--store", f"sqlite:///{tmp_path}/missing.db")
    assert missing.returncode == 1 and missing.stdout == "" and not list(tmp_path.iterdir())
    assert missing.stderr.startswith("error: no store at") and missing.stderr.count("\n") == 1
    usage = run_real("lag", "--bogus")
    assert usage.returncode == 2 and usage.stdout == "" and "Error: No such option: --bogus" in usage.stderr
    assert "╭" not in usage.stderr  # click's plain message, not a panel
    version = run_real("--version")
    assert version.returncode == 0 and version.stdout.startswith("scheduler ")


def test_recurring_check_prints_its_report_and_one_error_line(tmp_path, capsys):
    import json
    from datetime import UTC, datetime, timedelta

    from scheduler import Client
    from scheduler.domain.clock import FakeClock
    from scheduler.domain.keys import to_ms
    from scheduler.recurring.chain import GRACE_MS
    from scheduler.recurring.schedule import occurrence_id

    url = f"sqlite:///{tmp_path}/r.db"
    assert ROOT.main(["schema", "apply", "--store", url], "scheduler", standalone_mode=False) == 0
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    # Created long enough ago to be judged (a fresh schedule's first write may be on its way).
    with Client(url, clock=FakeClock(to_ms(datetime.now(UTC)) - 2 * GRACE_MS)) as client:
        client.recurring.create("b", kind="tick", every="1h", start=start)
    db = sqlite3.connect(url.removeprefix("sqlite:///"))
    with db:  # lose its only stored occurrence (a partial restore): nothing would fire again
        db.execute("DELETE FROM jobs WHERE job_id = ?", (occurrence_id("b", 1, to_ms(start)),))
    db.close()
    capsys.readouterr()
    code, out, err = invoke(capsys, ["recurring", "check", "--json", "--store", url])
    assert code == 1 and json.loads(out)["broken"] == ["b"]
    assert err.startswith("error: 1 recurring schedules will never fire again") and err.count("\n") == 1
