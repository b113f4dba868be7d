"""The due-now fast path on both stores: a job placed at now + late margin because it is
due now fires at its due time once its shard's owner is nudged, exactly once, and the
checkpoint never passes it while it runs. Driven step by step with an injected clock;
``test_due_now_live`` sends real datagrams to running pollers."""

from __future__ import annotations

from typing import Any

from scheduler import Client, Status
from scheduler.domain.clock import FakeClock
from scheduler.domain.model import Job
from scheduler.poller import Poller
from tests.contract.test_poller_contract import T0, T0_MS, Recorder, clock, make_poller, pstore

__all__ = ["clock", "pstore"]  # the fixtures, shared


def entry(job: Job) -> tuple[int, int, int, str]:
    return (job.shard, job.bucket, job.fire_ms, job.job_id)


def step(poller: Poller, clock: FakeClock, seconds: float) -> None:
    end = clock.now_ms() + int(seconds * 1000)
    while clock.now_ms() < end:
        poller.poll_once()
        for job in poller.dispatch_ready():
            assert job.due_ms <= clock.now_ms(), "dispatched before its due time"
            poller.fire(job)
        poller.record_outcomes()
        clock.advance(0.1)


def test_a_nudged_job_fires_at_its_due_time_once(pstore: Any, clock: FakeClock):
    client = Client(pstore, clock=clock)
    calls = Recorder(clock)
    poller = make_poller(pstore, clock, calls)
    job = client.schedule("now", T0, "k")
    assert job.fire_ms == T0_MS + client.meta.late_margin_ms, "placed by the late-write rule"
    poller.poll_once()
    assert poller.dispatch_ready() == [], "beyond the read horizon: the usual path waits"
    assert poller.nudge([entry(job)]) == 1
    assert poller.nudge([entry(job)]) == 0, "taken once"
    ready = poller.dispatch_ready()
    assert [j.job_id for j in ready] == ["now"]
    poller.fire(ready[0])
    poller.record_outcomes()
    step(poller, clock, 5)  # the cursor passes the row: not fired again
    assert [c[0] for c in calls.calls] == ["now"] and calls.calls[0][1] == T0_MS
    assert pstore.get("now").status is Status.FIRED
    poller.reader.maybe_checkpoint(force=True)
    cp = {c.shard: c for c in pstore.checkpoints()}[job.shard]
    assert cp.done_cursor is not None and cp.done_cursor >= (job.fire_ms, job.job_id)


def test_the_checkpoint_waits_for_a_nudged_job_in_flight(pstore: Any, clock: FakeClock):
    client = Client(pstore, clock=clock)
    calls = Recorder(clock)
    poller = make_poller(pstore, clock, calls)
    job = client.schedule("slow", T0, "k")
    assert poller.nudge([entry(job)]) == 1
    held = poller.dispatch_ready()  # dispatched, its outcome not recorded (a slow handler)
    assert [j.job_id for j in held] == ["slow"]
    step(poller, clock, 6)
    poller.reader.maybe_checkpoint(force=True)
    cp = {c.shard: c for c in pstore.checkpoints()}[job.shard]
    assert cp.done_cursor is None or cp.done_cursor < (job.fire_ms, job.job_id)
    assert calls.calls == [], "the cursor's read did not queue it a second time"
    poller.fire(held[0])
    poller.record_outcomes()
    step(poller, clock, 1)
    poller.reader.maybe_checkpoint(force=True)
    cp = {c.shard: c for c in pstore.checkpoints()}[job.shard]
    assert cp.done_cursor is not None and cp.done_cursor >= (job.fire_ms, job.job_id)
    assert [c[0] for c in calls.calls] == ["slow"]


def test_a_nudge_fires_nothing_early_nothing_unowned_and_nothing_unknown(pstore: Any, clock: FakeClock):
    client = Client(pstore, clock=clock)
    calls = Recorder(clock)
    later = client.schedule("later", from_s(T0_MS + 2_900), "k")  # due in 2.9 s: beyond the read horizon
    owned = [s for s in range(4) if s != later.shard]
    poller = make_poller(pstore, clock, calls, shards=owned)
    assert poller.nudge([entry(later)]) == 0, "not our shard"
    poller2 = make_poller(pstore, clock, calls, shards=[later.shard], epoch=2)
    ghost = (later.shard, later.bucket, later.fire_ms, "no-such-job")
    assert poller2.nudge([ghost]) == 0
    # Beyond the read horizon (2 s) but within the late margin: taken now, so that it
    # leaves at its due time rather than at its placed time, 0.1 s later.
    assert poller2.nudge([entry(later)]) == 1
    assert poller2.nudge([entry(later)]) == 0, "taken once"
    clock.advance(2.0)
    assert poller2.dispatch_ready() == []
    clock.advance(0.9)
    assert [j.job_id for j in poller2.dispatch_ready()] == ["later"], "at its due time, before its fire time"


def from_s(ms: int):
    from scheduler.domain.keys import from_ms

    return from_ms(ms)



def test_before_v004_due_now_jobs_fire_at_their_placed_time(store_kind, request, tmp_path, caplog):
    """Pollers and producers upgraded before `schema apply`: no nudge table. Both log it
    once and go on; the job fires at its placed time."""
    import threading
    from datetime import UTC, datetime

    from scheduler import App
    from scheduler.domain.clock import SystemClock
    from scheduler.poller import PollerConfig
    from scheduler.store import SchemaOptions
    from tests.conftest import drop_table, make_store

    # A store without v004's table (see drop_table: jobs need v007's columns).
    store = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=2))
    drop_table(store, "notify_endpoints")
    fired = threading.Event()
    poller = Poller(store, App.for_function(lambda job: fired.set()),
                    config=PollerConfig(poll_interval_s=0.2, check_clock=False))
    poller.start(range(2))
    client = Client(store)
    try:
        job = client.schedule("old", datetime.now(UTC), "k")
        assert fired.wait(15) and poller.failure is None
        assert job.fire_ms - job.due_ms >= 2_000, "placed by the late-write rule"
    finally:
        poller.stop()
        client.close()
        store.close()
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert "nudge_unavailable" in actions and "nudge_owners_failed" in actions
    assert SystemClock().now_ms() >= job.due_ms
