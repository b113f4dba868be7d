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
handler is dead-lettered at once, and so is a *poison row*: one whose kind breaks the key
contract (another language's producer wrote it) or whose JSON payload does not decode.

A handler running past its timeout (``timeout_s`` per kind, else the poller's
``handler_timeout_s``) counts as a failed attempt with the error "timed out after N s".
A coroutine function is an async handler: it runs on the poller's event loop, and its
timeout cancels it. An App's handlers are either all plain functions or all coroutines.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..errors import ConfigError, GiveUp, InvalidInput, RetryLater
from .httptarget import HTTP_KIND, HTTP_TIMEOUT_S
from .model import KIND_RE, POISON_KIND, Job, check_kind

Handler = Callable[[Job], Any]

DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_BACKOFF_BASE_S = 1.0
DEFAULT_BACKOFF_CAP_S = 3600.0
# The longest a ``RetryLater`` may put a retry off.
MAX_RETRY_DELAY_S = 86_400.0


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
class HttpOptions:
    """The built-in kind ``http``'s retry policy and request timeout."""

    policy: RetryPolicy
    timeout_s: float


@dataclass(frozen=True)
class Route:
    handler: Handler
    policy: RetryPolicy
    timeout_s: float | None = None  # None: the poller's ``handler_timeout_s``
    is_async: bool = False


def is_coroutine_handler(fn: Any) -> bool:
    """Whether calling ``fn`` returns a coroutine (an ``async def`` function, or an object
    whose ``__call__`` is one)."""
    call = None if inspect.isroutine(fn) else type(fn).__dict__.get("__call__")
    return inspect.iscoroutinefunction(fn) or (call is not None and inspect.iscoroutinefunction(call))


# Kinds seen by ``App.resolve``, at most; beyond, the cache starts over (only poison rows
# with ever-new kinds could get there).
_RESOLVED_MAX = 10_000


class App:
    """Handlers registered by kind."""

    def __init__(self, default_policy: RetryPolicy | None = None) -> None:
        self.default_policy = default_policy or RetryPolicy()
        self.routes: dict[str, Route] = {}
        self.fallback: Route | None = None
        self.http: HttpOptions | None = None  # the built-in kind's settings (``http_targets``)
        self._resolved: dict[str, Route | str] = {}

    def handler(self, kind: str, *, max_attempts: int | None = None,
                backoff_base_s: float | None = None, backoff_cap_s: float | None = None,
                timeout_s: float | None = None) -> Callable[[Handler], Handler]:
        """Register the decorated function (or coroutine function) for ``kind``.
        ``timeout_s``: how long one call may run before it counts as failed. Raises
        ``InvalidInput`` for a ``max_attempts`` that is not an integer of at least 1, a
        backoff that is not a positive number, or a kind no producer can write (a
        ``ValueError`` too); ``ConfigError`` for a ``timeout_s`` that is not > 0.
        Registering ``http`` replaces the built-in kind (``http_targets``)."""
        check_kind(kind)
        policy = self._policy(kind, max_attempts, backoff_base_s, backoff_cap_s, timeout_s)

        def register(fn: Handler) -> Handler:
            self.routes[kind] = Route(fn, policy, timeout_s, is_coroutine_handler(fn))
            self._resolved.clear()
            return fn

        return register

    def http_targets(self, *, max_attempts: int | None = None, backoff_base_s: float | None = None,
                     backoff_cap_s: float | None = None, timeout_s: float | None = None) -> None:
        """Settings of the built-in kind ``http`` (a job that calls a URL, run by every
        poller of this app unless it registers its own ``http`` handler): its retries and
        backoff, as ``handler`` takes them, and ``timeout_s``, the time one request may
        take (default ``HTTP_TIMEOUT_S``). Raises as ``handler`` does."""
        policy = self._policy(HTTP_KIND, max_attempts, backoff_base_s, backoff_cap_s, timeout_s)
        self.http = HttpOptions(policy, HTTP_TIMEOUT_S if timeout_s is None else float(timeout_s))

    def _policy(self, kind: str, max_attempts: int | None, backoff_base_s: float | None,
                backoff_cap_s: float | None, timeout_s: float | None) -> RetryPolicy:
        if max_attempts is not None and (isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
                                         or max_attempts < 1):
            raise InvalidInput(f"max_attempts={max_attempts!r} for kind {kind!r} must be an integer of at "
                               "least 1 (1: no retry)")
        for name, value in (("backoff_base_s", backoff_base_s), ("backoff_cap_s", backoff_cap_s)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not 0 < value < math.inf):
                raise InvalidInput(f"{name}={value!r} for kind {kind!r} must be a number of seconds > 0")
        if timeout_s is not None and not timeout_s > 0:
            raise ConfigError(f"timeout_s={timeout_s} for kind {kind!r} must be > 0")
        base = self.default_policy
        return RetryPolicy(base.max_attempts if max_attempts is None else max_attempts,
                           backoff_base_s or base.base_s, backoff_cap_s or base.cap_s)

    def http_route(self, handler: Handler) -> Route | None:
        """The route of the built-in kind ``http`` running ``handler`` (a coroutine
        function) with this app's ``http_targets`` settings; None when the app has an
        ``http`` handler of its own."""
        if HTTP_KIND in self.routes:
            return None
        options = self.http_options()
        return Route(handler, options.policy, options.timeout_s, True)

    def http_options(self) -> HttpOptions:
        """The built-in kind's settings: ``http_targets``', or the app's defaults."""
        return self.http or HttpOptions(self.default_policy, HTTP_TIMEOUT_S)

    def extended(self, routes: dict[str, Route], *, alone: bool = False) -> App:
        """A new app with ``routes`` added (the app's own routes for the same kinds win),
        or (``alone``) with only ``routes``. This app is left as it is."""
        app = App(self.default_policy)
        app.http = self.http
        app.routes = dict(routes) if alone else {**routes, **self.routes}
        app.fallback = None if alone else self.fallback
        return app

    def has_handlers(self) -> bool:
        """Whether the app has a handler of its own (a route, or one for every kind)."""
        return bool(self.routes) or self.fallback is not None

    def route(self, kind: str) -> Route | None:
        return self.routes.get(kind, self.fallback)

    def resolve(self, kind: str) -> Route | str:
        """The route for ``kind``, or why a job of that kind cannot run (no handler, or a
        kind that breaks the key contract: a poison row). One dict look-up per job."""
        found = self._resolved.get(kind)
        if found is None:
            if not KIND_RE.match(kind):
                found = (f"poison row: kind {kind[:80]!r}{'...' if len(kind) > 80 else ''} "
                         "breaks the key contract (1-64 letters, digits, '_', '.', ':' or '-')")
            else:
                found = self.route(kind) or f"no handler for kind {kind!r}"
            if len(self._resolved) >= _RESOLVED_MAX:
                self._resolved.clear()
            self._resolved[kind] = found
        return found

    def is_async(self) -> bool:
        """Whether the handlers are coroutines. Raises ``ConfigError`` for an App that
        mixes both (one poller runs either worker threads or an event loop)."""
        kinds = [r.is_async for r in (*self.routes.values(), *([self.fallback] if self.fallback else []))]
        if any(kinds) and not all(kinds):
            plain = sorted(k for k, r in self.routes.items() if not r.is_async)
            raise ConfigError(f"the app mixes coroutine and plain handlers ({', '.join(plain) or 'fallback'} "
                              "plain): make them all async (blocking code can run in "
                              "asyncio.to_thread) or all plain")
        return bool(kinds) and all(kinds)

    @classmethod
    def for_function(cls, fn: Handler, policy: RetryPolicy | None = None,
                     timeout_s: float | None = None) -> App:
        """An App sending every kind to ``fn``."""
        app = cls(policy)
        app.fallback = Route(fn, app.default_policy, timeout_s, is_coroutine_handler(fn))
        return app


def log_job(job: Job) -> None:
    """A handler that only logs the job: the default of docker-compose.yml's pollers, and
    a way to watch a fleet fire before writing real handlers."""
    logging.getLogger("scheduler.jobs").info(
        "fired %s (%s), due %s", job.job_id, job.kind, job.due_at.isoformat(),
        extra={"action": "job_logged", "job_id": job.job_id, "kind": job.kind})


class Outcome(NamedTuple):
    """What became of one fired job."""

    job: Job
    ok: bool
    error: str | None = None
    retry_at_ms: int | None = None  # set when the job is to be retried
    dead: bool = False
    started_ms: int = 0  # when the handler was called, by the poller's clock
    # An occurrence of a recurring schedule that did not run: "wait" (placed again at
    # ``retry_at_ms``, its attempts unchanged) or why it was skipped.
    skip: str | None = None
    # The handler's exception, for the recorder's log (its traceback's frames cleared:
    # a queued outcome must not keep a handler's locals alive).
    exc: BaseException | None = None

    @property
    def error_type(self) -> str:
        """What kind of failure this is, for logs and their summaries: the exception's
        type, or ``TimedOut``, ``PoisonRow``, ``NoHandler``."""
        error = self.error or ""
        if error.startswith("poison row"):
            return "PoisonRow"
        if self.exc is not None:
            return type(self.exc).__name__
        if error.startswith("timed out"):
            return "TimedOut"
        return "NoHandler"


def failed(route: Route, job: Job, error: str, started_ms: int, now_ms: int,
           rand: Callable[[], float], exc: BaseException | None = None, not_before_ms: int = 0) -> Outcome:
    """A failed attempt: retried after the kind's backoff (and no sooner than
    ``not_before_ms`` from now), or dead after its last attempt."""
    error = error[:2000]
    attempt = job.attempt
    if attempt >= route.policy.max_attempts:
        return Outcome(job, False, error, None, True, started_ms, exc=exc)
    delay = max(route.policy.delay_ms(attempt, rand()), not_before_ms)
    return Outcome(job, False, error, now_ms + delay, False, started_ms, exc=exc)


def error_of(job: Job, exc: BaseException) -> tuple[str, bool]:
    """The error text of a handler's exception, and whether the row is poison (its JSON
    payload does not decode: retrying cannot help). Checked only on failure, so the
    payload is never decoded twice on the way to a handler that succeeds."""
    if job.data_json and isinstance(exc, ValueError):
        try:
            json.loads(job.data)
        except ValueError as bad:
            return f"poison row: the payload is not valid JSON ({bad})", True
    return f"{type(exc).__name__}: {exc}", False


def run_handler(app: App, job: Job, now_ms: Callable[[], int],
                rand: Callable[[], float] = random.random) -> Outcome:
    """Call the job's handler and decide: done, retry (with its new fire time) or dead."""
    return run_route(app.resolve(job.kind), job, now_ms, rand)


def run_route(route: Route | str, job: Job, now_ms: Callable[[], int],
              rand: Callable[[], float] = random.random) -> Outcome:
    """``run_handler`` with the route already resolved (a str: why the job cannot run)."""
    started = now_ms()
    if isinstance(route, str):
        return refused(route, job, started)
    try:
        route.handler(job)
    except Exception as exc:  # a handler's failure is data, not a crash of the poller
        return failure(route, job, exc, started, now_ms(), rand)
    return Outcome(job, True, None, None, False, started)


def refused(reason: str, job: Job, started_ms: int) -> Outcome:
    """A job that cannot run (``App.resolve`` gave a reason): dead at once. A row the
    store could not read as a job carries its own reason."""
    if job.kind == POISON_KIND and job.last_error:
        reason = job.last_error
    return Outcome(job, False, reason, None, True, started_ms)


def clear_locals(exc: BaseException) -> None:
    """Drop the local variables of every frame in ``exc``'s tracebacks, its causes',
    contexts' and a group's members' included (``raise X from e`` keeps ``e``'s frames), so
    an outcome waiting to be recorded holds no handler's objects."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        todo += [e.__cause__, e.__context__]
        if isinstance(e, BaseExceptionGroup):
            todo += list(e.exceptions)


def failure(route: Route, job: Job, exc: BaseException, started_ms: int, now_ms: int,
            rand: Callable[[], float]) -> Outcome:
    """The outcome of a handler that raised ``exc``: ``GiveUp`` is dead at once, and
    ``RetryLater`` waits at least its delay; their messages are the error as it is."""
    if isinstance(exc, GiveUp | RetryLater):
        clear_locals(exc)
        if isinstance(exc, GiveUp):
            return Outcome(job, False, str(exc)[:2000], None, True, started_ms, exc=exc)
        delay = exc.delay_s if isinstance(exc.delay_s, int | float) and exc.delay_s > 0 else 0
        return failed(route, job, str(exc), started_ms, now_ms, rand, exc,
                      not_before_ms=int(min(delay, MAX_RETRY_DELAY_S) * 1000))
    error, poison = error_of(job, exc)
    clear_locals(exc)
    if poison:
        return Outcome(job, False, error, None, True, started_ms, exc=exc)
    return failed(route, job, error, started_ms, now_ms, rand, exc)
