"""Handlers against both stores: timeouts with hung handlers, async handlers, and poison
rows written straight into the store."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from scheduler import App, Client, Job, JobSpec, Status
from scheduler.domain.clock import FakeClock, SystemClock
from scheduler.domain.keys import bucket_of_ms, from_ms, shard_of
from scheduler.errors import ConfigError
from scheduler.poller import Poller, PollerConfig
from scheduler.store import SchemaOptions
from tests.conftest import make_store
from tests.contract.test_poller_contract import T0, T0_MS, drive, make_poller


@pytest.fixture
def live_store(store_kind: str, request: Any, tmp_path: Any):
    st = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=4))
    yield st
    st.close()


def wait_for(cond, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_hung_handlers_time_out_while_the_others_fire_on_time(live_store):
    """16 handlers hang for ever (as many as the worker threads) while 2,000 jobs are
    due over 4 s: the hung ones are timed out, retried, then dead-lettered, and the
    others fire on time. The bound (p99 under 500 ms) is loose on purpose: this is not a
    speed test, and a worker pool blocked by the hung handlers would make the others late
    by the whole hang (minutes), not by a fraction of a second."""
    release = threading.Event()
    lateness: list[int] = []
    now_ms = SystemClock().now_ms
    app = App()

    @app.handler("hang", timeout_s=0.05, max_attempts=2, backoff_base_s=0.1)
    def hang(job: Job) -> None:
        release.wait(120)

    @app.handler("ok")
    def ok(job: Job) -> None:
        lateness.append(now_ms() - job.due_ms)

    client = Client(live_store)
    t0 = now_ms() + 10_000  # a cold Cassandra takes a few seconds for 2,016 inserts
    specs = [JobSpec(f"h{i}", from_ms(t0), "hang") for i in range(16)]
    specs += [JobSpec(f"o{i}", from_ms(t0 + i * 2), "ok") for i in range(2000)]
    client.schedule_many(specs)
    assert now_ms() < t0 - 3000, "written ahead of the late margin: nothing was moved"
    poller = Poller(live_store, app, config=PollerConfig(concurrency=16, check_clock=False))
    poller.start(range(4), epoch=1)
    try:
        wait_for(lambda: len(lateness) == 2000 and poller.stats.dead == 16, 60, "2,000 fired, 16 dead")
    finally:
        release.set()
        poller.stop()
    lateness.sort()
    assert lateness[0] >= 0, "never early"
    assert lateness[int(len(lateness) * 0.99)] < 500, f"p99 {lateness[int(len(lateness) * 0.99)]} ms"
    dead = client.get("h3")
    assert dead.status is Status.DEAD and dead.attempts == 2
    assert dead.last_error == "timed out after 0.05 s"
    assert poller.stats.timed_out == 32 and poller.stats.fired == 2000


def test_async_handlers_fire_retry_time_out_and_dead_letter(live_store):
    seen: list[str] = []
    app = App()

    @app.handler("ok")
    async def ok(job: Job) -> None:
        await asyncio.sleep(0.05)
        seen.append(job.job_id)

    @app.handler("flaky", max_attempts=2, backoff_base_s=0.1)
    async def flaky(job: Job) -> None:
        raise ValueError("nope")

    @app.handler("slow", timeout_s=0.05, max_attempts=1)
    async def slow(job: Job) -> None:
        await asyncio.sleep(30)

    client = Client(live_store)
    due = from_ms(SystemClock().now_ms() + 4000)
    client.schedule_many([JobSpec(f"a{i}", due, "ok") for i in range(200)]
                         + [JobSpec("f", due, "flaky"), JobSpec("s", due, "slow")])
    poller = Poller(live_store, app, config=PollerConfig(concurrency=500, check_clock=False))
    poller.start(range(4), epoch=1)
    try:
        wait_for(lambda: poller.stats.fired == 200 and poller.stats.dead == 2, 30, "200 fired, 2 dead")
    finally:
        poller.stop()
    assert sorted(seen) == sorted(f"a{i}" for i in range(200))
    assert client.get("a7").status is Status.FIRED
    f = client.get("f")
    assert f.status is Status.DEAD and f.attempts == 2 and f.last_error == "ValueError: nope"
    s = client.get("s")
    assert s.status is Status.DEAD and s.last_error == "timed out after 0.05 s"
    assert poller.metrics.handler_timeouts.labels("slow")._value.get() == 1
    assert poller.metrics.retries.labels("flaky")._value.get() == 1


def test_an_app_mixing_coroutines_and_functions_is_refused(live_store):
    app = App()

    @app.handler("a")
    async def a(job: Job) -> None: ...

    @app.handler("b")
    def b(job: Job) -> None: ...

    with pytest.raises(ConfigError, match="mixes coroutine and plain handlers"):
        Poller(live_store, app)


@pytest.fixture
def pstore(store_kind: str, request: Any, tmp_path: Any):
    st = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=4), now_ms=T0_MS - 60_000)
    yield st
    st.close()


def raw_job(job_id: str, kind: str, data: bytes, due_ms: int) -> Job:
    """A job as another language's producer could write it: no client checks."""
    return Job(job_id, kind, data, True, due_ms, due_ms, bucket_of_ms(due_ms, 60), shard_of(job_id, 4))


def test_poison_rows_are_dead_lettered_and_the_shard_keeps_firing(pstore, store_kind, tmp_path):
    clock = FakeClock(T0_MS)
    client = Client(pstore, clock=clock)
    due = T0_MS + 5000
    pstore.insert_many([raw_job("p-kind", "k" * 100, b"{}", due),
                        raw_job("p-json", "k", b"\xff{not json", due)])
    if store_kind == "sqlite":  # a row the store returns but that cannot be read as a job
        db = sqlite3.connect(tmp_path / "store.db")
        with db:
            db.execute("INSERT INTO jobs_by_bucket (bucket, shard, fire_at, job_id, due_at, kind, "
                       "payload, payload_json, attempts) VALUES (?, ?, ?, ?, 'garbage', 'k', x'', 0, 0)",
                       (bucket_of_ms(due, 60), shard_of("p-row", 4), due, "p-row"))
        db.close()
    client.schedule_many([JobSpec(f"g{i}", T0 + timedelta(seconds=5, milliseconds=i), "k", {"i": i})
                          for i in range(20)])
    fired: list[Any] = []
    poller = make_poller(pstore, clock, lambda job: fired.append(job.payload["i"]))
    drive(poller, clock, 10)
    assert sorted(fired) == list(range(20)), "every good job fired"
    p_kind, p_json = client.get("p-kind"), client.get("p-json")
    assert p_kind.status is Status.DEAD and (p_kind.last_error or "").startswith("poison row: kind 'kkk")
    assert p_json.status is Status.DEAD and p_json.attempts == 1, "poison is not retried"
    assert (p_json.last_error or "").startswith("poison row: the payload is not valid JSON")
    if store_kind == "sqlite":
        dead = {d.job_id: d for d in pstore.dead_letters()}
        assert dead["p-row"].error.startswith("poison row: cannot be read as a job (ValueError")
    cps = {c.shard: c.drained for c in pstore.checkpoints()}
    assert all(d >= T0_MS // 1000 - 60 for d in cps.values()), "every shard's checkpoint moved on"


def test_overlap_skip_with_a_handler_slower_than_the_interval(live_store):
    """Real threads: every 5 s, each run takes 7 s; no two runs of the schedule overlap."""
    runs: list[tuple[float, float]] = []

    def slow(job: Job) -> None:
        start = time.monotonic()
        time.sleep(7)
        runs.append((start, time.monotonic()))

    client = Client(live_store)
    client.recurring.create("slow", kind="tick", every="5s", overlap="skip")
    poller = Poller(live_store, App.for_function(slow), config=PollerConfig(check_clock=False))
    poller.start(range(4), epoch=1)
    try:
        time.sleep(24)
    finally:
        poller.stop(timeout_s=10)
    runs.sort()
    assert len(runs) >= 2
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(runs)), runs
    assert client.recurring.get("slow").skipped >= 1
