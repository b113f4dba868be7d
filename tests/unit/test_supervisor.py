"""The ``--processes`` supervisor's policy, with real (tiny) child processes."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from scheduler.errors import InvalidInput
from scheduler.runtime import supervisor
from scheduler.runtime.supervisor import Member, Supervisor, member_argv, offset_address, processes_default


def test_member_argv_replaces_the_per_member_options_in_both_forms():
    argv = ["--handler", "m:f", "--processes", "3", "--metrics-address=0.0.0.0:9000", "--name", "p",
            "--log-json"]
    assert member_argv(argv, 2, "0.0.0.0:9000", "p") == [
        "--handler", "m:f", "--log-json", "--metrics-address", "0.0.0.0:9002", "--name", "p-2"]
    assert member_argv(["--processes=2"], 1, "off", None) == ["--metrics-address", "off"]


def test_offset_address_keeps_off_and_any_port():
    assert offset_address("127.0.0.1:9460", 3) == "127.0.0.1:9463"
    assert offset_address("[::1]:9460", 1) == "[::1]:9461"
    assert offset_address("127.0.0.1:0", 5) == "127.0.0.1:0"
    assert offset_address("off", 2) == "off"


def test_processes_zero_means_one_per_core_and_negative_is_refused():
    assert processes_default(3) == 3
    assert processes_default(0) >= 1
    with pytest.raises(InvalidInput, match="--processes"):
        processes_default(-1)


def child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def run_supervisor(members: list[Member],
                   stop_after: float | None = None) -> tuple[int, list[str], Supervisor]:
    lines: list[str] = []
    sup = Supervisor(members, lambda m: subprocess.Popen(m.argv), lines.append)
    if stop_after is not None:
        threading.Timer(stop_after, sup.stop.set).start()
    return sup.run(), lines, sup


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(supervisor, "BACKOFF_S", (0.05, 0.2))
    monkeypatch.setattr(supervisor, "STOP_GRACE_S", 5.0)


def test_a_member_that_exits_is_restarted_and_sigterm_stops_all_cleanly():
    # Member 0 dies at once with code 4 (the first time only: it leaves a marker file).
    once = ("import os,sys,time,tempfile\n"
            "p=os.path.join(tempfile.gettempdir(),'sup-once-%d'%os.getppid())\n"
            "if not os.path.exists(p): open(p,'w').close(); sys.exit(4)\n"
            "import signal; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(60)")
    sleeper = "import signal,sys,time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(60)"
    code, lines, sup = run_supervisor([Member(0, child(once), {}), Member(1, child(sleeper), {})],
                                      stop_after=2.0)
    assert code == 0
    assert sup.restarts == 1
    assert any("member 0 exited with code 4; restarting" in line for line in lines)
    assert all(m.proc is not None and m.proc.returncode == 0 for m in sup.members)


def test_members_that_keep_crashing_end_the_supervisor_with_5():
    code, lines, sup = run_supervisor([Member(0, child("import sys; sys.exit(3)"), {})])
    assert code == supervisor.EXIT_CRASH_LOOP
    assert sup.restarts == supervisor.CRASH_LIMIT - 1
    assert "exiting 5" in lines[-1]


def test_a_member_that_refuses_its_settings_stops_everything_with_1():
    sleeper = "import signal,sys,time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(60)"
    members = [Member(0, child("import sys; sys.exit(1)"), {}), Member(1, child(sleeper), {})]
    code, _lines, sup = run_supervisor(members)
    assert code == supervisor.EXIT_BAD_SETTINGS
    assert sup.restarts == 0
    assert members[1].proc is not None and members[1].proc.returncode == 0
