"""Handlers for benchmarks."""

import atexit
import os
import threading
import time

from scheduler import Job


def handle(job: Job) -> None:
    return None


_buffer: list[bytes] = []
_lock = threading.Lock()
_flusher: threading.Thread | None = None


def _flush() -> None:
    with _lock:
        data, _buffer[:] = b"".join(_buffer), []
    if data:
        fd = os.open(os.environ["BENCH_OUT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def _flush_forever() -> None:
    while True:
        time.sleep(0.1)
        _flush()


def sleep10(job: Job) -> None:
    """An I/O-bound handler: 10 ms of waiting, then ``note``."""
    time.sleep(0.01)
    note(job)


def note(job: Job) -> None:
    """A handler that notes ``id due start`` in $BENCH_OUT (start = when it was called, wall
    clock ms), in writes batched every 100 ms so the instrumentation costs little next to
    the work."""
    global _flusher
    line = f"{job.job_id} {job.due_ms} {time.time_ns() // 1_000_000}\n".encode()
    with _lock:
        _buffer.append(line)
        if _flusher is None:
            _flusher = threading.Thread(target=_flush_forever, daemon=True)
            _flusher.start()
            atexit.register(_flush)
