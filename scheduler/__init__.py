"""A durable scheduler for future one-shot jobs on Apache Cassandra and ZooKeeper."""

from .client import Client, JobSpec
from .dispatch import App, RetryPolicy
from .errors import (
    ConfigError,
    InvalidInput,
    JobNotFound,
    ResizeRefused,
    SchedulerError,
    SchemaError,
    StoreUnavailable,
    WriteTimeout,
)
from .model import Job, Status

__all__ = [
    "App",
    "Client",
    "ConfigError",
    "InvalidInput",
    "Job",
    "JobNotFound",
    "JobSpec",
    "ResizeRefused",
    "RetryPolicy",
    "SchedulerError",
    "SchemaError",
    "Status",
    "StoreUnavailable",
    "WriteTimeout",
]
__version__ = "0.1.0"
