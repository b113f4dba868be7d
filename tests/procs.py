"""Helpers for tests that run real poller processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from scheduler import Client, JobSpec

ROOT = Path(__file__).parents[1]


def start_poller(url: str, out: Path, *extra: str, env: dict[str, str] | None = None,
                 handler: str = "tests.handlers:record") -> subprocess.Popen[bytes]:
    """A `scheduler run` process recording into ``out``; its log goes to ``<out>.log``."""
    # Port 0: several pollers on one machine each get a free metrics port.
    full_env = {**os.environ, "SCHEDULER_TEST_OUT": str(out), "SCHEDULER_STORE": url,
                "SCHEDULER_METRICS_ADDRESS": "127.0.0.1:0", **(env or {})}
    with open(f"{out}.log", "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "scheduler", "run", "--handler", handler,
                                 "--log-json", *extra], cwd=ROOT, env=full_env,
                                stdout=subprocess.DEVNULL, stderr=log)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kill_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """kill -9 every process still running, and reap it."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def stop_all(procs: list[subprocess.Popen[Any]], timeout: float = 30) -> None:
    """SIGTERM every process, wait up to ``timeout`` s for each, then kill -9 and reap
    whichever is still running."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wait_until(pred: Callable[[], bool], timeout: float, what: str,
               explain: Callable[[], str] | None = None) -> None:
    """Poll ``pred`` until it holds; on a timeout fail with ``what`` and, if given, what
    ``explain`` says of the state then (what a failure on CI needs to be read)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.1)
    said = ""
    if explain is not None:
        try:
            said = f"\n{explain()}"
        except Exception as exc:  # the timeout is the failure; an explanation that fails must not hide it
            said = f"\n(explaining failed: {type(exc).__name__}: {exc})"
    raise AssertionError(f"timed out waiting for {what}{said}")


def log_tail(path: Path, n: int = 30, levels: tuple[str, ...] = ("warning", "error")) -> str:
    """The last ``n`` JSON log lines of ``path`` at these levels, for a failure message."""
    if not path.exists():
        return f"(no log at {path})"
    lines = [raw for raw in path.read_text(errors="replace").splitlines()
             if any(f'"level": "{lv}"' in raw or f'"level":"{lv}"' in raw for lv in levels)
             or not raw.startswith("{")]
    return "\n".join(lines[-n:])


def schedule(client: Client, n: int, over_s: float, lead_s: float = 4.0, prefix: str = "p") -> dict[str, int]:
    start = datetime.now(UTC) + timedelta(seconds=lead_s)
    jobs = client.schedule_many([JobSpec(f"{prefix}{i}", start + timedelta(seconds=over_s * i / n), "record")
                                 for i in range(n)])
    return {j.job_id: j.due_ms for j in jobs}
