"""A handler that does nothing, for benchmarks."""

from scheduler import Job


def handle(job: Job) -> None:
    return None
