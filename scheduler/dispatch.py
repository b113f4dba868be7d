"""Handlers and what happens when they fail.

A handler is a callable taking one argument, the fired job (a ``scheduler.Job``: it has
``job_id``, ``kind``, ``payload`` as given to ``schedule``, ``due_at`` and ``attempt``).
Either one function receives every kind (``--handler module:function``), or an ``App``
routes by kind (``--app module:app``)::

    app = App()

    @app.handler("email", max_attempts=8)
    def send_email(job): ...

An exception retries the job with exponential backoff and jitter, up to the kind's
``max_attempts``; then the job is dead-lettered with its last error. A kind with no
handler is dead-lettered at once.
"""

from __future__ import annotations

import importlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from .errors import ConfigError
from .model import Job

Handler = Callable[[Job], Any]

DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_BACKOFF_BASE_S = 1.0
DEFAULT_BACKOFF_CAP_S = 3600.0


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    base_s: float = DEFAULT_BACKOFF_BASE_S
    cap_s: float = DEFAULT_BACKOFF_CAP_S

    def delay_ms(self, attempt: int, rand: float) -> int:
        """Backoff after failed attempt ``attempt`` (1-based): ``base * 2^(attempt-1)``
        capped, scaled by a jitter factor in [0.5, 1.0] from ``rand`` in [0, 1)."""
        raw = min(self.cap_s, self.base_s * (2 ** (attempt - 1)))
        return int(raw * (0.5 + rand / 2) * 1000)


@dataclass(frozen=True)
class Route:
    handler: Handler
    policy: RetryPolicy


class App:
    """Handlers registered by kind."""

    def __init__(self, default_policy: RetryPolicy | None = None) -> None:
        self.default_policy = default_policy or RetryPolicy()
        self.routes: dict[str, Route] = {}
        self.fallback: Route | None = None

    def handler(self, kind: str, *, max_attempts: int | None = None,
                backoff_base_s: float | None = None,
                backoff_cap_s: float | None = None) -> Callable[[Handler], Handler]:
        """Register the decorated function for ``kind``."""
        base = self.default_policy
        policy = RetryPolicy(max_attempts or base.max_attempts, backoff_base_s or base.base_s,
                             backoff_cap_s or base.cap_s)

        def register(fn: Handler) -> Handler:
            self.routes[kind] = Route(fn, policy)
            return fn

        return register

    def route(self, kind: str) -> Route | None:
        return self.routes.get(kind, self.fallback)

    @classmethod
    def for_function(cls, fn: Handler, policy: RetryPolicy | None = None) -> App:
        """An App sending every kind to ``fn``."""
        app = cls(policy)
        app.fallback = Route(fn, app.default_policy)
        return app


def log_job(job: Job) -> None:
    """A handler that only logs the job: the default of docker-compose.yml's pollers, and
    a way to watch a fleet fire before writing real handlers."""
    logging.getLogger("scheduler.jobs").info(
        "fired %s (%s), due %s", job.job_id, job.kind, job.due_at.isoformat(),
        extra={"action": "job_logged", "job_id": job.job_id, "kind": job.kind})


def load_object(spec: str) -> Any:
    """Import ``module:attribute``; a bad spec is a ``ConfigError`` naming it."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{spec!r} is not module:attribute (e.g. myapp.jobs:handle)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r} for {spec!r}: {exc}") from None
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ConfigError(f"{module_name!r} has no attribute {attr!r}") from None
    return obj


def load_app(handler: str | None = None, app: str | None = None) -> App:
    """The App for ``--handler module:function`` or ``--app module:app`` (exactly one)."""
    if (handler is None) == (app is None):
        raise ConfigError("give exactly one of --handler module:function or --app module:app")
    if handler is not None:
        fn = load_object(handler)
        if not callable(fn):
            raise ConfigError(f"{handler!r} is not callable")
        return App.for_function(fn)
    obj = load_object(app or "")
    if not isinstance(obj, App):
        raise ConfigError(f"{app!r} is a {type(obj).__name__}, not a scheduler.App")
    return obj


class Outcome(NamedTuple):
    """What became of one fired job."""

    job: Job
    ok: bool
    error: str | None = None
    retry_at_ms: int | None = None  # set when the job is to be retried
    dead: bool = False
    started_ms: int = 0  # when the handler was called, by the poller's clock


def run_handler(app: App, job: Job, now_ms: Callable[[], int],
                rand: Callable[[], float] = random.random) -> Outcome:
    """Call the job's handler and decide: done, retry (with its new fire time) or dead."""
    started = now_ms()
    route = app.route(job.kind)
    if route is None:
        return Outcome(job, False, f"no handler for kind {job.kind!r}", None, True, started)
    try:
        route.handler(job)
    except Exception as exc:  # a handler's failure is data, not a crash of the poller
        error = f"{type(exc).__name__}: {exc}"[:2000]
        attempt = job.attempt
        if attempt >= route.policy.max_attempts:
            return Outcome(job, False, error, None, True, started)
        return Outcome(job, False, error, now_ms() + route.policy.delay_ms(attempt, rand()), False, started)
    return Outcome(job, True, None, None, False, started)
