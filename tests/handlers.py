"""Handlers used by tests that run real poller processes.

``record`` appends one line per call to the file named by $SCHEDULER_TEST_OUT:
``job_id due_ms fired_ms attempt pid``; a single write() of a short line with O_APPEND
is atomic, so several processes can share the file.
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

from scheduler import App, Job


def record(job: Job) -> None:
    line = f"{job.job_id} {job.due_ms} {time.time_ns() // 1_000_000} {job.attempt} {os.getpid()}\n"
    fd = os.open(os.environ["SCHEDULER_TEST_OUT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def slow(job: Job) -> None:
    time.sleep(0.01)
    record(job)


app = App()
app.handler("record")(record)


class Record(NamedTuple):
    job_id: str
    due_ms: int
    fired_ms: int
    attempt: int
    pid: int


def read_records(path: str) -> list[Record]:
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as fh:
        for line in fh:
            job_id, due, fired, attempt, pid = line.split()
            out.append(Record(job_id, int(due), int(fired), int(attempt), int(pid)))
    return out
