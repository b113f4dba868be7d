"""A handler that does nothing, for benchmarks."""

from scheduler import Job


def handle(job: Job) -> None:
    return None


def sleep10(job: Job) -> None:
    """An I/O-bound handler: 10 ms of waiting, then one line in $BENCH_OUT."""
    import os
    import time

    time.sleep(0.01)
    line = f"{job.job_id} {job.due_ms} {time.time_ns() // 1_000_000}\n".encode()
    fd = os.open(os.environ["BENCH_OUT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
