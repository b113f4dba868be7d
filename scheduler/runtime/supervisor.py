"""``scheduler run --processes N``: N pollers on one host, each a separate process with
its own ZooKeeper session, under one supervisor (dramatiq's ``--processes``, gunicorn's
``--workers``). A poller's per-job path is Python, so one process uses about one core.

The supervisor
- starts member ``i`` as ``scheduler run`` with the same options, its metrics on the
  base port + ``i`` (and its nudge listener likewise when that port is fixed), and the
  name ``NAME-i`` when ``--name`` was given;
- restarts a member that exits, whatever its code (3 and 4 ask for exactly that),
  after a back-off that doubles from 0.5 s up to 10 s while it keeps failing fast;
- passes SIGTERM and SIGINT on to every member, waits for their graceful stop (up to
  ``STOP_GRACE_S``, then SIGKILL), and returns 0 when all stopped cleanly.

Exit codes, for its own supervisor (systemd, Kubernetes):

| code | meaning |
|---|---|
| 0 | stopped on SIGTERM/SIGINT, every member stopped cleanly |
| 1 | a member refused its settings (exit 1): restarting cannot help |
| 5 | members keep crashing: ``CRASH_LIMIT`` exits within ``CRASH_WINDOW_S`` |

Members are not restarted while the supervisor stops. A crash of the supervisor itself
leaves its members running until their own SIGTERM (they are in its process group, so
a terminal's Ctrl-C or a container stop reaches them too).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import InvalidInput
from ..producer.wire import parse_address

log = logging.getLogger("scheduler.run")

EXIT_OK = 0
EXIT_BAD_SETTINGS = 1
EXIT_CRASH_LOOP = 5
CRASH_LIMIT = 5
CRASH_WINDOW_S = 60.0
STOP_GRACE_S = 60.0
BACKOFF_S = (0.5, 10.0)
# Options the supervisor sets per member; their values on its own command line are replaced.
PER_MEMBER = ("--processes", "--metrics-address", "--name")


def processes_default(requested: int) -> int:
    """``--processes``: 0 means one per core; negative is refused."""
    if requested < 0:
        raise InvalidInput(f"--processes must be >= 0 (0: one per core), got {requested}")
    return requested or os.cpu_count() or 1


def offset_address(address: str, index: int) -> str:
    """``HOST:PORT`` with the port moved up by ``index``; ``off`` and port 0 (any free
    port) are kept as they are."""
    if address == "off":
        return address
    host, port = parse_address(address)
    if port == 0:
        return address
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port + index}"


def member_argv(argv: Sequence[str], index: int, metrics_address: str, name: str | None) -> list[str]:
    """The ``scheduler run`` arguments of member ``index``: ``argv`` without the
    per-member options (``--opt value`` and ``--opt=value`` forms), then this member's."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in PER_MEMBER:
            skip = True
            continue
        if arg.split("=", 1)[0] in PER_MEMBER and "=" in arg:
            continue
        out.append(arg)
    out += ["--metrics-address", offset_address(metrics_address, index)]
    if name:
        out += ["--name", f"{name}-{index}"]
    return out


@dataclass
class Member:
    index: int
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    failures: int = 0  # consecutive fast exits, for the back-off
    started: float = 0.0
    restart_at: float | None = None


class Supervisor:
    """Runs members until ``stop`` is set, restarting those that exit; see the module
    docstring for the policy. ``spawn`` starts one member (tests pass their own)."""

    def __init__(self, members: list[Member], spawn: Callable[[Member], subprocess.Popen[bytes]],
                 say: Callable[[str], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.members = members
        self.spawn = spawn
        self.say = say
        self.clock = clock
        self.stop = threading.Event()
        self.crashes: deque[float] = deque()
        self.restarts = 0

    def run(self) -> int:
        for m in self.members:
            self._start(m)
        code = EXIT_OK
        while not self.stop.wait(0.2):
            code = self._tick()
            if code != EXIT_OK:
                break
        self._stop_all()
        return code

    def _start(self, m: Member) -> None:
        m.proc = self.spawn(m)
        m.started = self.clock()
        m.restart_at = None

    def _tick(self) -> int:
        now = self.clock()
        for m in self.members:
            if m.proc is None:
                if m.restart_at is not None and now >= m.restart_at:
                    self._start(m)
                    self.restarts += 1
                continue
            rc = m.proc.poll()
            if rc is None:
                if now - m.started > BACKOFF_S[1]:
                    m.failures = 0  # it ran a while: the next exit starts the back-off afresh
                continue
            m.proc = None
            if rc == EXIT_BAD_SETTINGS:
                self.say(f"member {m.index} refused its settings (exit 1); stopping every member")
                return EXIT_BAD_SETTINGS
            self.crashes.append(now)
            while self.crashes and now - self.crashes[0] > CRASH_WINDOW_S:
                self.crashes.popleft()
            if len(self.crashes) >= CRASH_LIMIT:
                self.say(f"members exited {len(self.crashes)} times within {CRASH_WINDOW_S:.0f} s; "
                         f"stopping every member and exiting {EXIT_CRASH_LOOP}")
                return EXIT_CRASH_LOOP
            delay = min(BACKOFF_S[0] * 2 ** m.failures, BACKOFF_S[1])
            m.failures += 1
            m.restart_at = now + delay
            self.say(f"member {m.index} exited with code {rc}; restarting it in {delay:.1f} s")
        return EXIT_OK

    def _stop_all(self) -> None:
        live = [m.proc for m in self.members if m.proc is not None and m.proc.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        deadline = self.clock() + STOP_GRACE_S
        for p in live:
            try:
                p.wait(timeout=max(0.0, deadline - self.clock()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        unclean = [p.returncode for p in live if p.returncode not in (0, -signal.SIGTERM)]
        if unclean:
            self.say(f"members stopped with codes {unclean}")


def supervise(count: int, argv: Sequence[str], metrics_address: str, notify_address: str,
              name: str | None, say: Callable[[str], None]) -> int:
    """Run ``count`` members of ``scheduler run argv`` until SIGTERM/SIGINT; returns the
    supervisor's exit code (module table)."""
    members = []
    for i in range(count):
        env = dict(os.environ, SCHEDULER_NOTIFY_ADDRESS=offset_address(notify_address, i))
        # -P: the working directory is not put first on sys.path, so a member started
        # where a source tree lies (a checkout, a container's /app) runs the installed
        # package like its supervisor; `run` still adds it later, for handler modules.
        members.append(Member(i, [sys.executable, "-P", "-m", "scheduler", "run",
                                  *member_argv(argv, i, metrics_address, name)], env))

    def spawn(m: Member) -> subprocess.Popen[bytes]:
        return subprocess.Popen(m.argv, env=m.env)

    sup = Supervisor(members, spawn, say)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: sup.stop.set())
    first, last = offset_address(metrics_address, 0), offset_address(metrics_address, count - 1)
    ports = "metrics off" if metrics_address == "off" else f"metrics on {first} to {last}"
    say(f"supervising {count} pollers (pid {os.getpid()}); {ports}")
    code = sup.run()
    say(f"supervisor stopped: exit {code} after {sup.restarts} restarts")
    return code
