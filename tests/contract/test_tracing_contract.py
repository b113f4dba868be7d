"""Traces from producer to handler, on both stores, with the SDK's in-memory exporter: the
producer's span is stored with the job as its ``traceparent``, and each attempt a real
poller makes is a span whose parent is that one (same trace), with the job's kind, id,
attempt, lateness and outcome. Tracing off: nothing is stored but an incoming request's
``traceparent``, which is passed through."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from scheduler import App, AsyncClient, Client, Job, JobSpec
from scheduler.domain.clock import FakeClock
from scheduler.domain.traceparent import parse_stored
from scheduler.errors import SchemaError
from scheduler.observe import tracing
from scheduler.poller import Poller, PollerConfig
from scheduler.poller.workers import ThreadWorkers
from scheduler.settings import Settings
from scheduler.store import SchemaOptions, Store
from scheduler.store.base import SCHEMA_VERSION
from tests.conftest import make_store
from tests.contract.test_poller_contract import T0, T0_MS, drive, make_poller
from tests.contract.test_priority_key_contract import SHARDS, _write_v006_rows

INCOMING = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def spans() -> Iterator[tuple[InMemorySpanExporter, TracerProvider]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter, provider
    finally:
        tracing.shutdown()
        provider.shutdown()


@pytest.fixture
def live_store(store_kind: str, request: Any, tmp_path: Any) -> Iterator[Store]:
    st = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=4))
    yield st
    st.close()


@pytest.fixture
def pstore(store_kind: str, request: Any, tmp_path: Any) -> Iterator[Store]:
    st = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=4), now_ms=T0_MS - 60_000)
    yield st
    st.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0_MS)


def wait_for(cond: Any, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def traceparent_of(span: Any) -> str:
    sc = span.get_span_context()
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"


def assert_child(child: ReadableSpan, parent_tp: str | None) -> None:
    ids = None if parent_tp is None else parse_stored(parent_tp)
    assert ids is not None and child.parent is not None
    assert (child.context.trace_id, child.parent.span_id) == (ids.trace_id, ids.span_id)
    assert child.parent.is_remote  # read back from the store, not a span of this process


def test_the_producers_span_is_stored_and_each_attempt_is_its_child(live_store, spans):
    exporter, provider = spans
    seen: dict[str, str | None] = {}
    app = App()

    @app.handler("email")
    def email(job: Job) -> None:
        seen[job.job_id] = tracing.outgoing_traceparent(job)

    client = Client(live_store, settings=Settings(nudge=False))
    with provider.get_tracer("app").start_as_current_span("request") as request:
        job = client.schedule("t1", datetime.now(UTC), "email", {"to": "a"})
    [produced] = named(exporter, "scheduler.schedule")
    assert produced.kind is SpanKind.PRODUCER and produced.parent is not None
    assert produced.parent.span_id == request.get_span_context().span_id
    assert dict(produced.attributes or {}) == {"scheduler.job.id": "t1", "scheduler.job.kind": "email"}
    assert job.traceparent == traceparent_of(produced) == live_store.get("t1").traceparent

    poller = Poller(live_store, app, config=PollerConfig(check_clock=False))
    poller.start(range(4), epoch=1)
    try:
        wait_for(lambda: poller.stats.fired == 1 and named(exporter, tracing.ATTEMPT_SPAN), 30, "the attempt")
    finally:
        poller.stop()
    [attempt] = named(exporter, tracing.ATTEMPT_SPAN)
    assert_child(attempt, job.traceparent)
    assert attempt.kind is SpanKind.CONSUMER
    attrs: dict[str, Any] = dict(attempt.attributes or {})
    assert {k: attrs[k] for k in ("scheduler.job.id", "scheduler.job.kind", "scheduler.job.attempt",
                                  "scheduler.job.outcome")} == {
        "scheduler.job.id": "t1", "scheduler.job.kind": "email", "scheduler.job.attempt": 1,
        "scheduler.job.outcome": "fired"}
    # Due now, so placed a late margin ahead: it started about that late.
    assert 2_000 <= int(attrs["scheduler.job.lateness_ms"]) < 20_000
    # A request the handler makes (an HTTP target) carries the attempt's span.
    assert seen["t1"] == traceparent_of(attempt)
    client.close()


def test_retries_and_the_dead_attempt_are_children_of_the_same_producer_span(pstore, clock, spans):
    exporter, _ = spans
    app = App()

    @app.handler("flaky", max_attempts=2, backoff_base_s=1)
    def flaky(job: Job) -> None:
        raise RuntimeError(f"down on attempt {job.attempt}")

    client = Client(pstore, clock=clock)
    job = client.schedule("r1", T0 + timedelta(seconds=5), "flaky")
    assert job.traceparent is not None
    drive(make_poller(pstore, clock, None, app=app), clock, 30)
    attempts = sorted(named(exporter, tracing.ATTEMPT_SPAN),
                      key=lambda s: int((s.attributes or {})["scheduler.job.attempt"]))  # type: ignore[arg-type]
    assert [(s.attributes or {})["scheduler.job.outcome"] for s in attempts] == ["retry", "dead"]
    for n, span in enumerate(attempts, 1):
        assert_child(span, job.traceparent)
        attrs = dict(span.attributes or {})
        assert attrs["scheduler.job.attempt"] == n and attrs["error.type"] == "RuntimeError"
        assert attrs["scheduler.job.error"] == f"RuntimeError: down on attempt {n}"
        assert span.status.status_code is StatusCode.ERROR
    # The retry's row carried the traceparent on.
    assert pstore.get("r1").traceparent == job.traceparent


def test_schedule_many_reschedule_and_cancel_have_spans(pstore, clock, spans):
    exporter, _ = spans
    client = Client(pstore, clock=clock)
    jobs = client.schedule_many([JobSpec(f"m{i}", T0 + timedelta(minutes=5), "k") for i in range(3)])
    [many] = named(exporter, "scheduler.schedule_many")
    assert {j.traceparent for j in jobs} == {traceparent_of(many)}
    moved = client.reschedule("m0", T0 + timedelta(minutes=9))
    [resched] = named(exporter, "scheduler.reschedule")
    assert moved.traceparent == traceparent_of(resched) == pstore.get("m0").traceparent
    assert client.cancel("m1") is True
    [cancel] = named(exporter, "scheduler.cancel")
    assert (cancel.attributes or {})["scheduler.job.id"] == "m1"
    # A call that fails says so on its span.
    with pytest.raises(Exception, match="kind"):
        client.schedule("bad", T0, "not a kind")
    [failed] = [s for s in named(exporter, "scheduler.schedule") if s.status.status_code is StatusCode.ERROR]
    assert (failed.attributes or {})["error.type"] == "InvalidInput"
    # With tracing off a reschedule keeps the traceparent the job has.
    tracing.shutdown()
    kept = client.reschedule("m2", T0 + timedelta(minutes=7))
    assert kept.traceparent == traceparent_of(many)


def test_async_calls_of_one_group_write_store_their_own_spans(live_store, spans):
    exporter, provider = spans
    app = App()
    ran = threading.Event()

    @app.handler("a")
    async def handle(job: Job) -> None:
        if job.job_id == "a1":
            ran.set()

    async def produce() -> list[Job]:
        async with AsyncClient(live_store, settings=Settings(nudge=False)) as client:
            tracer = provider.get_tracer("app")

            async def one(i: int) -> Job:
                with tracer.start_as_current_span(f"request {i}"):
                    return await client.schedule(f"a{i}", datetime.now(UTC), "a")
            return list(await asyncio.gather(*(one(i) for i in range(4))))

    jobs = asyncio.run(produce())
    produced = named(exporter, "scheduler.schedule")
    assert len({s.context.trace_id for s in produced}) == 4  # four requests, four traces
    assert sorted(j.traceparent for j in jobs) == sorted(traceparent_of(s) for s in produced)  # type: ignore[type-var]
    poller = Poller(live_store, app, config=PollerConfig(check_clock=False))
    poller.start(range(4), epoch=1)
    try:
        wait_for(lambda: len(named(exporter, tracing.ATTEMPT_SPAN)) == 4, 30, "four async attempts")
    finally:
        poller.stop()
    by_id = {(s.attributes or {})["scheduler.job.id"]: s for s in named(exporter, tracing.ATTEMPT_SPAN)}
    for job in jobs:
        assert_child(by_id[job.job_id], job.traceparent)


def test_a_timed_out_handlers_attempt_ends_with_the_timeout(tmp_path, request, spans):
    exporter, _ = spans
    store = make_store("sqlite", request, tmp_path, SchemaOptions(shard_count=4))
    release = threading.Event()
    app = App()

    @app.handler("hang", timeout_s=0.05, max_attempts=1)
    def hang(job: Job) -> None:
        release.wait(30)

    client = Client(store, settings=Settings(nudge=False))
    job = client.schedule("h1", datetime.now(UTC), "hang")
    poller = Poller(store, app, config=PollerConfig(check_clock=False))
    poller.start(range(4), epoch=1)
    try:
        wait_for(lambda: poller.stats.dead == 1 and named(exporter, tracing.ATTEMPT_SPAN), 30, "the timeout")
        release.set()
        workers = poller.workers
        assert isinstance(workers, ThreadWorkers)
        wait_for(lambda: poller.stats.abandoned_threads == 1 and workers.abandoned_alive == 0,
                 30, "the abandoned handler to return")
    finally:
        release.set()
        poller.stop()
        store.close()
    [attempt] = named(exporter, tracing.ATTEMPT_SPAN)  # the late return ends nothing again
    assert_child(attempt, job.traceparent)
    attrs = dict(attempt.attributes or {})
    assert (attrs["scheduler.job.outcome"], attrs["error.type"]) == ("dead", "TimedOut")


def test_tracing_off_stores_nothing_but_an_incoming_traceparent(pstore, clock):
    assert not tracing.active()
    client = Client(pstore, clock=clock)
    assert client.schedule("o1", T0 + timedelta(minutes=5), "k").traceparent is None
    with tracing.incoming(INCOMING):
        passed = client.schedule("o2", T0 + timedelta(minutes=5), "k")
        assert tracing.outgoing_traceparent() == INCOMING
    with tracing.incoming("00-not-a-traceparent"):
        ignored = client.schedule("o3", T0 + timedelta(minutes=5), "k")
    assert (passed.traceparent, ignored.traceparent) == (INCOMING, None)
    assert pstore.get("o2").traceparent == INCOMING
    # A poller that does not trace forwards the stored one on the job's requests.
    assert tracing.outgoing_traceparent(passed) == INCOMING and tracing.outgoing_traceparent() is None


def test_an_incoming_traceparent_is_the_parent_of_the_producer_span(pstore, clock, spans):
    exporter, _ = spans
    client = Client(pstore, clock=clock)
    with tracing.incoming(INCOMING.encode()):
        job = client.schedule("i1", T0 + timedelta(minutes=5), "k")
    [produced] = named(exporter, "scheduler.schedule")
    assert_child(produced, INCOMING)
    assert job.traceparent == traceparent_of(produced)



def test_the_http_apis_requests_make_the_spans_docs_tracing_md_names(pstore, clock, spans):
    """One job over POST /v1/jobs is a ``scheduler.schedule_many`` span (the API writes
    every job through one path), PATCH a ``scheduler.reschedule``, DELETE a ``scheduler.cancel``."""
    from tests.apihelp import Api

    exporter, _ = spans
    api = Api(Client(pstore, clock=clock))
    at = (T0 + timedelta(minutes=5)).isoformat()
    assert api.call("producer", "POST", "/v1/jobs", {"id": "a1", "at": at, "kind": "k"},
                    headers={"traceparent": INCOMING}).status_code == 201
    later = (T0 + timedelta(minutes=9)).isoformat()
    assert api.call("producer", "PATCH", "/v1/jobs/a1", {"at": later}).is_success
    assert api.call("producer", "DELETE", "/v1/jobs/a1").is_success
    assert [s.name for s in exporter.get_finished_spans()] == [
        "scheduler.schedule_many", "scheduler.reschedule", "scheduler.cancel"]
    assert_child(named(exporter, "scheduler.schedule_many")[0], INCOMING)


def test_a_v009_store_refuses_until_schema_apply_then_old_rows_run_untraced(store_kind, request, tmp_path,
                                                                             clock, spans):
    exporter, _ = spans
    st9 = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=SHARDS, upto=9),
                     now_ms=T0_MS - 60_000)
    try:
        _write_v006_rows(st9, store_kind, tmp_path)  # rows with no traceparent column at all
        early = Client(st9, clock=clock)
        for call in (lambda: early.get("old"), lambda: st9.read_bucket(0, 0, None, 2**62, 10),
                     lambda: early.schedule("early", T0 + timedelta(minutes=5), "k")):
            with pytest.raises(SchemaError, match="schema apply"):
                call()
        early.close()
        res = st9.apply_schema(SchemaOptions(shard_count=SHARDS), T0_MS)
        assert (res.from_version, res.to_version) == (9, SCHEMA_VERSION)
        client = Client(st9, clock=clock)
        assert client.get("old").traceparent is None
        new = client.schedule("new", T0 + timedelta(minutes=5), "k")
        assert new.traceparent is not None
        drive(make_poller(st9, clock, lambda job: None, shards=range(SHARDS)), clock, 330, step_ms=1000)
        by_id = {(s.attributes or {})["scheduler.job.id"]: s for s in named(exporter, tracing.ATTEMPT_SPAN)}
        assert by_id["old"].parent is None  # a root span of its own
        assert_child(by_id["new"], new.traceparent)
        client.close()
    finally:
        st9.close()
