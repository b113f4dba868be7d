"""Traces from producer to handler with OpenTelemetry: optional, and free when off.

Tracing is on in a process once ``setup`` found an OTLP endpoint in the standard
variables (``settings.tracing_settings``) and the OpenTelemetry packages importable
(``pip install 'scheduler[tracing]'``), or once ``install`` was given a tracer provider
(an application that configures OpenTelemetry in code; the tests' in-memory exporter).
Otherwise it is off: no OpenTelemetry module is imported, every hook returns at once, and
the poller's workers hold None instead of an ``Attempts`` (one ``is None`` test per job).

How the context flows (docs/tracing.md):

- a producer call (``Client``/``AsyncClient`` schedule, schedule_many, reschedule, cancel)
  runs in a ``producer_span``, a child of the caller's current span; its W3C
  ``traceparent`` is stored with each job it writes (schema v010);
- the HTTP API runs each request under ``incoming`` (``TraceparentMiddleware``), so a
  request's ``traceparent`` header is the parent of that span;
- a poller reads the job's ``traceparent`` back and starts each attempt's span as its
  child (``Attempts.start``); the handler runs with that span current;
- an outgoing request made for a job (HTTP targets) carries ``outgoing_traceparent``.

With tracing off, a valid incoming ``traceparent`` is still stored and a stored one still
forwarded (``producer_span`` and ``outgoing_traceparent`` pass them through), so a trace
continues across a process that exports nothing.

Nothing here logs an OTEL_* header: they may hold tokens, and the exporter reads them.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Any

from ..domain.model import Job
from ..domain.traceparent import format_traceparent, parse_traceparent
from ..settings import TracingSettings, tracing_settings
from .attempts import ATTEMPT_SPAN, Attempts, AttemptSpan, text

__all__ = ["ATTEMPT_SPAN", "AttemptSpan", "Attempts", "TraceparentMiddleware", "active", "attempts", "flush",
           "incoming", "install", "outgoing_traceparent", "producer_span", "setup", "shutdown"]

log = logging.getLogger("scheduler.tracing")

TRACER_NAME = "scheduler"


class _On:
    """Tracing on: the tracer, the OpenTelemetry modules the hooks use (imported only
    here), and the provider when this module made it (flushed and shut down by us)."""

    def __init__(self, provider: Any, owned: bool) -> None:
        from opentelemetry import context, trace

        self.trace, self.context = trace, context
        self.provider, self.owned = provider, owned
        self.tracer = provider.get_tracer(TRACER_NAME)
        self.producer_kind, self.consumer_kind = trace.SpanKind.PRODUCER, trace.SpanKind.CONSUMER
        self.error = trace.StatusCode.ERROR

    def remote(self, trace_id: int, span_id: int, flags: int) -> Any:
        """A context whose current span is a remote one (a stored or incoming traceparent)."""
        sc = self.trace.SpanContext(trace_id, span_id, is_remote=True,
                                    trace_flags=self.trace.TraceFlags(flags))
        return self.trace.set_span_in_context(self.trace.NonRecordingSpan(sc), self.context.Context())

    def traceparent(self, span: Any) -> str | None:
        sc = span.get_span_context()
        if not sc.is_valid:
            return None
        return format_traceparent(sc.trace_id, sc.span_id, int(sc.trace_flags))


_on: _On | None = None
_lock = threading.Lock()
_warned: set[str] = set()
# With tracing off: a valid traceparent from an incoming request (``incoming``), stored
# as it is with the jobs that request schedules.
_incoming: ContextVar[str | None] = ContextVar("scheduler_incoming_traceparent", default=None)


def active() -> bool:
    """Whether this process records spans."""
    return _on is not None


def setup(config: TracingSettings | None = None, *, process: bool = False) -> bool:
    """Turn tracing on if ``config`` (default: the environment) names an OTLP endpoint
    and OpenTelemetry is installed; True when it is on (also when it already was).

    A provider already installed globally by the application (an SDK ``TracerProvider``)
    is used as it is. Otherwise one is made, exporting in batches over OTLP; ``process``:
    this process is a poller or a CLI command, so it also becomes the global provider
    (the handlers' own spans are exported with the attempts'). Never raises for a missing
    package or an unsupported protocol: it says so once in the log and stays off.
    ``ConfigError`` comes only from reading bad variables (``tracing_settings``)."""
    if _on is not None:
        return True
    config = config if config is not None else tracing_settings()
    if not config.enabled or config.endpoint is None:
        return False
    with _lock:
        if _on is not None:
            return True
        exporter = _exporter(config)
        if exporter is None:
            return False
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):
            _turn_on(current, owned=False)
        else:
            resource = Resource.create()
            if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
                resource = resource.merge(Resource({"service.name": "scheduler"}))
            provider = TracerProvider(resource=resource)
            provider.add_span_processor(BatchSpanProcessor(exporter))
            if process:
                trace.set_tracer_provider(provider)
            _turn_on(provider, owned=True)
    log.info("tracing on: spans exported over OTLP (%s) to %s", config.protocol, config.shown,
             extra={"action": "tracing_on", "protocol": config.protocol, "endpoint": config.shown})
    return True


class _HideHeaders(logging.Filter):
    """The SDK logs an OTEL_EXPORTER_OTLP_HEADERS entry it cannot parse whole, and the
    entry may hold a token: the record keeps its message, the entry is not shown."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith("Header format invalid"):
            record.args = ("(the entry is not shown: it may hold a credential)",)
        return True


_HIDE_HEADERS = _HideHeaders()


def _exporter(config: TracingSettings) -> Any:
    """The OTLP span exporter for ``config``, or None (said once in the log) when the
    packages are missing or the protocol has no exporter here. The exporter reads its
    headers, timeout and certificates from the standard variables itself."""
    # Before the exporter parses the headers (when it is made).
    logging.getLogger("opentelemetry.util.re").addFilter(_HIDE_HEADERS)
    try:
        if config.protocol == "grpc":
            # Not a dependency of scheduler[tracing]: imported by name, when asked for.
            grpc = importlib.import_module("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
            return grpc.OTLPSpanExporter(endpoint=config.endpoint)
        if config.protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            return OTLPSpanExporter(endpoint=config.endpoint)
    except ImportError as exc:
        package = ("opentelemetry-exporter-otlp-proto-grpc" if config.protocol == "grpc"
                   else "scheduler[tracing]")
        _warn_once(config.protocol, f"an OTLP endpoint is set but {exc.name or 'OpenTelemetry'} cannot be "
                   f"imported: install {package}; tracing stays off")
        return None
    _warn_once(config.protocol, f"OTLP protocol {config.protocol} has no exporter for Python: set "
               "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf; tracing stays off")
    return None


def _warn_once(key: str, text: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(text, extra={"action": "tracing_off"})


def _turn_on(provider: Any, owned: bool) -> None:
    global _on
    _on = _On(provider, owned)


def install(provider: Any = None) -> None:
    """Record spans with ``provider`` (an OpenTelemetry ``TracerProvider``; None: the
    global one), whatever the environment says: for an application that configures
    OpenTelemetry in code, and for tests. The provider stays the caller's to shut down."""
    with _lock:
        if provider is None:
            from opentelemetry import trace

            provider = trace.get_tracer_provider()
        _turn_on(provider, owned=False)


def flush(timeout_s: float = 5.0) -> None:
    """Export the spans ended so far, waiting up to ``timeout_s``; never raises."""
    on = _on
    if on is not None and on.owned:
        try:
            on.provider.force_flush(int(timeout_s * 1000))
        except Exception as exc:  # a collector that is down must not fail a shutdown
            log.warning("tracing: flushing spans failed: %s", type(exc).__name__,
                        extra={"action": "tracing_flush_failed"})


def shutdown() -> None:
    """Turn tracing off; a provider ``setup`` made is flushed and shut down. Idempotent."""
    global _on
    with _lock:
        on, _on = _on, None
    if on is not None and on.owned:
        try:
            on.provider.shutdown()
        except Exception as exc:
            log.warning("tracing: shutting down the exporter failed: %s", type(exc).__name__,
                        extra={"action": "tracing_flush_failed"})


# --- producers and the HTTP API -------------------------------------------------------------


class _PassThrough(AbstractContextManager[str | None]):
    """``producer_span`` with tracing off: no span; the traceparent of an incoming request
    (``incoming``), if any, is what the jobs store."""

    def __enter__(self) -> str | None:
        return _incoming.get()

    def __exit__(self, *exc: object) -> None:
        return None


_PASS = _PassThrough()


def producer_span(name: str, job_id: object = None,
                  kind: object = None) -> AbstractContextManager[str | None]:
    """A span (kind PRODUCER) around one producer call, a child of the current span;
    entering gives the ``traceparent`` the call's jobs store (None: store none). An
    exception leaving it marks the span failed with the exception's type. ``job_id`` and
    ``kind`` are the caller's arguments, not checked yet: set as attributes when text."""
    on = _on
    if on is None:
        return _PASS
    return _producer(on, name, job_id, kind)


@contextmanager
def _producer(on: _On, name: str, job_id: object, kind: object) -> Any:
    attributes = {k: text(v) for k, v in (("scheduler.job.id", job_id), ("scheduler.job.kind", kind))
                  if isinstance(v, str)}
    span = on.tracer.start_span(name, kind=on.producer_kind, attributes=attributes)
    token = on.context.attach(on.trace.set_span_in_context(span))
    try:
        yield on.traceparent(span)
    except BaseException as exc:
        span.set_attribute("error.type", text(type(exc).__name__))
        span.set_status(on.error, text(type(exc).__name__))
        raise
    finally:
        on.context.detach(token)
        span.end()


@contextmanager
def incoming(header: str | bytes | None) -> Any:
    """Run the block as the handling of a request that carried ``header`` as its
    ``traceparent``: producer calls in it are its children (tracing on), or store it
    (off). An invalid or absent header is ignored: the request has no parent, never an
    error."""
    if isinstance(header, bytes):
        header = header.decode("latin-1")
    ids = parse_traceparent(header)
    on = _on
    if ids is None:
        yield
    elif on is not None:
        token = on.context.attach(on.remote(*ids))
        try:
            yield
        finally:
            on.context.detach(token)
    else:
        reset = _incoming.set(ids.text())
        try:
            yield
        finally:
            _incoming.reset(reset)


ASGIApp = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]


class TraceparentMiddleware:
    """ASGI middleware: each HTTP request is handled under ``incoming`` with its
    ``traceparent`` header (a request with two is treated as having none, as the W3C
    specification says)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        found = [v for k, v in scope.get("headers") or () if k.lower() == b"traceparent"]
        with incoming(found[0] if len(found) == 1 else None):
            await self.app(scope, receive, send)


def outgoing_traceparent(job: Job | None = None) -> str | None:
    """The ``traceparent`` for a request made on behalf of ``job`` (HTTP targets): the
    current span's (the job's attempt, when it runs under ``Attempts.start``), else the
    job's stored one, else that of the request being handled (``incoming``)."""
    on = _on
    if on is not None:
        found = on.traceparent(on.trace.get_current_span())
        if found is not None:
            return found
    if job is not None and job.traceparent is not None:
        return job.traceparent
    return _incoming.get()


# --- pollers ---------------------------------------------------------------------------------


def attempts() -> Attempts | None:
    """What a poller's workers trace attempts with: None while tracing is off (read once,
    when they are made)."""
    on = _on
    return None if on is None else Attempts(on)
