"""A durable scheduler for future jobs, one-shot and recurring, on Apache Cassandra and ZooKeeper."""

from typing import TYPE_CHECKING

from .domain.dispatch import App, RetryPolicy, log_job
from .domain.jobspec import JobSpec
from .domain.model import Job, Status
from .errors import (
    ConfigError,
    InvalidInput,
    JobNotFound,
    ResizeRefused,
    ScheduleConflict,
    ScheduleNotFound,
    SchedulerError,
    SchemaError,
    StoreUnavailable,
    WriteTimeout,
)
from .producer.aclient import AsyncClient
from .producer.client import Client

if TYPE_CHECKING:
    from .runtime.runner import run_poller


def __getattr__(name: str) -> object:
    # Lazy: a producer importing ``scheduler`` does not pay for the poller's modules.
    if name == "run_poller":
        from .runtime.runner import run_poller

        return run_poller
    raise AttributeError(f"module 'scheduler' has no attribute {name!r}")


__all__ = [
    "App",
    "AsyncClient",
    "Client",
    "ConfigError",
    "InvalidInput",
    "Job",
    "JobNotFound",
    "JobSpec",
    "ResizeRefused",
    "RetryPolicy",
    "ScheduleConflict",
    "ScheduleNotFound",
    "SchedulerError",
    "SchemaError",
    "Status",
    "StoreUnavailable",
    "WriteTimeout",
    "log_job",
    "run_poller",
]

# The one source of the version: pyproject.toml reads this literal (setuptools `attr:`) for
# the distribution's metadata. Keep it a plain string literal, which setuptools can read
# without importing the package.
__version__ = "0.1.0"
