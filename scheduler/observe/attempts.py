"""Attempt spans: one per attempt a poller makes (kind CONSUMER), the child of the span
whose ``traceparent`` the job stored. Made by ``tracing.attempts()`` only while tracing is
on, so nothing here runs, and no OpenTelemetry module is imported, while it is off."""

from __future__ import annotations

from typing import Any, Protocol

from ..domain.dispatch import Outcome
from ..domain.model import Job
from ..domain.traceparent import parse_stored

ATTEMPT_SPAN = "scheduler.attempt"
# A handler's error text on an attempt's span is cut as the recorder's log line cuts it.
ERROR_CHARS = 300


class Tracer(Protocol):
    """What attempts need of tracing's state (``tracing._On``): the tracer, OpenTelemetry's
    ``trace`` and ``context`` modules, and remote parents."""

    @property
    def tracer(self) -> Any: ...
    @property
    def trace(self) -> Any: ...
    @property
    def context(self) -> Any: ...
    @property
    def consumer_kind(self) -> Any: ...
    @property
    def error(self) -> Any: ...

    def remote(self, trace_id: int, span_id: int, flags: int) -> Any: ...


def text(value: str, limit: int = 512) -> str:
    """``value`` as an attribute can carry it: cut, and a lone surrogate (which UTF-8
    cannot encode: the exporter would drop the whole batch) replaced."""
    return value[:limit].encode("utf-8", "replace").decode("utf-8")


class AttemptSpan:
    """One attempt's span, current in the thread or task that called ``Attempts.start``
    until ``leave``. ``end`` records the outcome once (the first call wins: a handler
    that returns after the watchdog timed it out does not overwrite the recorded
    timeout)."""

    __slots__ = ("_on", "_span", "_token", "job")

    def __init__(self, on: Tracer, span: Any, token: Any, job: Job) -> None:
        self._on, self._span, self._token, self.job = on, span, token, job

    def end(self, outcome: Outcome | None) -> None:
        """Record ``outcome`` (None: the attempt did not finish, the poller stopping) and
        end the span; later calls do nothing. Any thread may call it."""
        span, self._span = self._span, None
        if span is None:
            return
        if outcome is not None:
            span.set_attribute("scheduler.job.lateness_ms", max(0, outcome.started_ms - self.job.due_ms))
            span.set_attribute("scheduler.job.outcome", outcome_word(outcome))
            if not outcome.ok:
                span.set_attribute("error.type", text(outcome.error_type))
                span.set_attribute("scheduler.job.error", text(outcome.error or "", ERROR_CHARS))
                span.set_status(self._on.error, text(outcome.error_type))
        else:
            span.set_attribute("scheduler.job.outcome", "interrupted")
        span.end()

    def leave(self) -> None:
        """Stop being the current span (in the thread or task that started it)."""
        token, self._token = self._token, None
        if token is not None:
            self._on.context.detach(token)

    def finish(self, outcome: Outcome | None) -> None:
        self.end(outcome)
        self.leave()


def outcome_word(outcome: Outcome) -> str:
    """``fired``, ``retry``, ``dead``, or for an occurrence that did not run its reason."""
    if outcome.ok:
        return "fired"
    if outcome.skip is not None:
        return outcome.skip
    return "dead" if outcome.dead else "retry"


class Attempts:
    """Starts the span of each attempt a poller makes (kind CONSUMER), the child of the
    span whose ``traceparent`` the job stored, or a root span when it stored none."""

    def __init__(self, on: Tracer) -> None:
        self._on = on

    def start(self, job: Job) -> AttemptSpan:
        """Start ``job``'s attempt span and make it current here; never raises for a job's
        content (a stored traceparent was checked when read)."""
        on = self._on
        ids = None if job.traceparent is None else parse_stored(job.traceparent)
        parent = on.context.Context() if ids is None else on.remote(*ids)
        span = on.tracer.start_span(ATTEMPT_SPAN, context=parent, kind=on.consumer_kind, attributes={
            "scheduler.job.id": text(job.job_id), "scheduler.job.kind": text(job.kind),
            "scheduler.job.attempt": job.attempt})
        token = on.context.attach(on.trace.set_span_in_context(span, parent))
        return AttemptSpan(on, span, token, job)
