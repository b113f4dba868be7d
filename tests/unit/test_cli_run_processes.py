"""``scheduler run --processes N`` gives each member the options of its own command line,
rebuilt from what was parsed (``cli.common.given_options``), whatever ``sys.argv`` holds:
a program named ``run``, a program that calls the CLI with arguments of its own, an
option whose value is ``run`` or starts with ``--``. In-process, the supervisor replaced:
no servers, no child processes."""

from __future__ import annotations

import sys
from typing import Any, cast

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

import scheduler.cli.main  # noqa: F401  (registers every command)
from scheduler import logs
from scheduler.cli.common import app, given_options
from scheduler.runtime import supervisor
from scheduler.runtime.supervisor import member_argv

PER_MEMBER = ("processes", "metrics_address", "name")
ZK = "zookeeper://zk.invalid:2181/run"  # parsed only: nothing connects
HANDLER = "tests.handlers:record"


def run_context(args: list[str]) -> typer.Context:
    """``scheduler run ARGS`` parsed (callbacks run), not invoked."""
    group = get_command(app)
    run = group.get_command(typer.Context(group), "run")  # type: ignore[attr-defined]
    assert run is not None
    # typer hands its commands this context, under the name typer.Context
    return cast(typer.Context, run.make_context("run", list(args)))


def given(ctx: typer.Context) -> dict[str, Any]:
    """The parameters the command line set, with their parsed values."""
    return {k: v for k, v in ctx.params.items()
            if (src := ctx.get_parameter_source(k)) is not None and src.name == "COMMANDLINE"}


SHAPES = [
    # (the run command's arguments, what a member gets before its per-member options)
    (["--handler", "run", "--processes", "2"], ["--handler=run"]),
    (["--name", "run", "--handler=m:f", "--processes=3", "--log-json", "--coordinator", ZK],
     ["--handler=m:f", f"--coordinator={ZK}", "--log-json"]),
    (["--processes", "2", "--handler", "--processes", "--metrics-address", "0.0.0.0:9000"],
     ["--handler=--processes"]),
    (["--app", "run:app", "--concurrency", "4", "--max-rate", "0.5", "--poll-interval", "250ms",
      "--store", "sqlite:///run/s.db", "--processes", "0"],
     ["--app=run:app", "--concurrency=4", "--poll-interval=250ms", "--max-rate=0.5",
      "--store=sqlite:///run/s.db"]),
    (["--processes", "2"], []),
]


@pytest.mark.parametrize(("args", "expected"), SHAPES)
def test_given_options_are_the_command_line_without_the_per_member_ones(args, expected):
    ctx = run_context(args)
    rebuilt = given_options(ctx, leave_out=PER_MEMBER)
    assert rebuilt == expected
    # Parsed again (as a member parses them), they are the parent's options but those left out.
    child = given(run_context(rebuilt))
    assert child == {k: v for k, v in given(ctx).items() if k not in PER_MEMBER}
    # The supervisor's filter keeps every word, then sets the per-member options.
    assert member_argv(rebuilt, 1, "127.0.0.1:9460", "p")[:len(rebuilt)] == rebuilt


@pytest.fixture
def supervised(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Each ``argv`` ``scheduler run --processes`` gives the supervisor; no member starts."""
    seen: list[list[str]] = []

    def supervise(count: int, argv: list[str], *rest: Any) -> int:
        seen.append(list(argv))
        return 0

    monkeypatch.setattr(supervisor, "supervise", supervise)
    monkeypatch.setattr(logs, "setup", lambda **kw: None)  # keep the test's own logging
    monkeypatch.setattr(sys, "path", list(sys.path))  # run puts the current directory first
    return seen


@pytest.mark.parametrize("program_argv", [
    ["run", "run", "--handler", HANDLER, "--processes", "2"],  # a program (or wrapper) named run
    ["/srv/run/bin/scheduler", "run", "--processes", "2"],
    ["myapp", "--mode", "run", "--port", "8080"],  # a program calling the CLI with its own argv
    ["pytest"],
])
def test_members_get_the_parsed_options_whatever_sys_argv_holds(supervised, monkeypatch, program_argv):
    monkeypatch.setattr(sys, "argv", program_argv)
    args = ["run", "--handler", HANDLER, "--coordinator", ZK, "--processes", "2", "--name", "run",
            "--concurrency", "3"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert supervised == [[f"--handler={HANDLER}", f"--coordinator={ZK}", "--concurrency=3"]]
