"""``scheduler demo`` with numbers too large is refused at once, and SIGTERM stops it
as Ctrl-C does: the temporary store is removed, exit 143."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.errors import InvalidInput
from scheduler.runtime.demo import MAX_JOBS, check_demo, run_demo
from tests.procs import wait_until


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env["TMPDIR"] = str(tmp_path)  # where the demo's temporary store goes
    return env


@pytest.mark.parametrize(("jobs", "pollers", "seconds", "says"), [
    (MAX_JOBS + 1, 2, 20.0, "--jobs"), (99999999999, 2, 20.0, "--jobs"), (0, 2, 20.0, "--jobs"),
    (10, 0, 20.0, "--pollers"), (10, 10_000, 20.0, "--pollers"),
    (10, 2, 10**9, "--seconds"), (10, 2, float("nan"), "--seconds"), (10, 2, 0.0, "--seconds")])
def test_numbers_out_of_bounds_are_refused(jobs, pollers, seconds, says):
    with pytest.raises(InvalidInput, match=says):
        check_demo(jobs, pollers, seconds)
    with pytest.raises(InvalidInput, match=says):  # the library entry point checks too
        run_demo(jobs, pollers, seconds)


@pytest.mark.parametrize("args", [["--jobs", "99999999999"], ["--pollers", "100000"],
                                  ["--seconds", "3650d"]])
def test_the_cli_refuses_them_in_one_line_before_anything(tmp_path: Path, args):
    res = subprocess.run([sys.executable, "-m", "scheduler", "demo", "--json", *args], env=_env(tmp_path),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and res.stderr.startswith("error: --"), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_sigterm_removes_the_temporary_store_and_exits_143(tmp_path: Path):
    proc = subprocess.Popen([sys.executable, "-m", "scheduler", "demo", "--json", "--jobs", "20",
                             "--seconds", "1h"], env=_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: any(tmp_path.glob("scheduler-demo-*/demo.db")), 60, "the demo's store")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
