"""A job flow control places later (held by a pause, deferred by a rate) keeps the last
word of its producer, on both stores: a cancel or a reschedule acknowledged after the
poller read the row, and before the poller placed it, is not undone by the placement
(which would write the job back as pending: a cancel undone, or a rescheduled job
fired at its old time). The recorder is driven directly with the outcome the
dispatcher or a worker gives a held job, so the race is built, not waited for."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from scheduler import Client, JobSpec
from scheduler.domain.clock import SystemClock
from scheduler.domain.dispatch import Outcome
from scheduler.domain.keys import from_ms
from scheduler.domain.model import Job, Status
from scheduler.observe.metrics import PollerMetrics
from scheduler.poller import PollerConfig
from scheduler.poller.flowqueue import DEFERRED, HELD
from scheduler.poller.occurrences import WAIT
from scheduler.poller.recorder import Recorder
from scheduler.poller.shared import Core
from scheduler.store import SchemaOptions, Store
from tests.conftest import make_store

HOLD_MS = 30_000


@pytest.fixture
def pstore(store_kind: str, request: Any, tmp_path: Any) -> Iterator[Store]:
    st = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=2))
    yield st
    st.close()


def _row_as_read(store: Store, job: Job) -> Job:
    """The job's bucket row, as a poller's read returns it."""
    [rows] = store.read_buckets([(job.bucket, job.shard, None, job.fire_ms)], 100)
    [row] = [r for r in rows if r.job_id == job.job_id and r.fire_ms == job.fire_ms]
    return row


def _place(store: Store, row: Job, why: str, at_ms: int | None = None) -> Recorder:
    """What the poller does with a held or deferred row: a WAIT outcome, recorded."""
    now = SystemClock().now_ms()
    core = Core(store, SystemClock(), PollerConfig(), "p", PollerMetrics(), store.meta())
    at = now + HOLD_MS if at_ms is None else at_ms
    core.outcomes.put([Outcome(row, False, why, at, False, now, WAIT)])
    recorder = Recorder(core)
    assert recorder.record_outcomes() == 1
    return recorder


def _pending_rows(store: Store, job_id: str, job: Job) -> list[Job]:
    """Every pending row of ``job_id`` from its first bucket to two minutes past it."""
    out = []
    width = store.meta().bucket_width_s
    for bucket in range(job.bucket, job.bucket + 3 * width, width):
        for shard in range(2):
            [rows] = store.read_buckets([(bucket, shard, None, 2**62)], 1000)
            out += [r for r in rows if r.job_id == job_id and r.fired_ms is None]
    return out


def _job(client: Client, job_id: str) -> Job:
    return client.schedule(job_id, from_ms(SystemClock().now_ms() + 5_000), "k", {"n": 1})


@pytest.mark.parametrize("why", [HELD, DEFERRED])
def test_a_job_not_touched_meanwhile_is_placed_later(pstore: Store, why: str):
    with Client(pstore) as client:
        job = _job(client, "kept")
        row = _row_as_read(pstore, job)
        _place(pstore, row, why)
        [pending] = _pending_rows(pstore, "kept", job)
        assert pending.fire_ms > job.fire_ms and pending.due_ms == job.due_ms
        got = client.get("kept")
        assert got is not None and got.status == Status.PENDING and got.last_error == why


def test_a_row_placed_again_at_its_own_time_moves_past_it(pstore: Store):
    """A recalled row (queued ahead of its placed time) deferred again to that very
    time: rewritten in place, the row would be pending where the poller's progress has
    its position complete, and would never be read again. It goes a millisecond on."""
    with Client(pstore) as client:
        job = _job(client, "again")
        _place(pstore, _row_as_read(pstore, job), DEFERRED)
        [placed] = _pending_rows(pstore, "again", job)
        _place(pstore, _row_as_read(pstore, placed), DEFERRED, at_ms=placed.fire_ms)
        [pending] = _pending_rows(pstore, "again", job)
        assert pending.fire_ms == placed.fire_ms + 1 and pending.due_ms == job.due_ms
        [old] = [r for r in pstore.read_buckets([(placed.bucket, placed.shard, None, placed.fire_ms)], 100)[0]
                 if r.job_id == "again" and r.fire_ms == placed.fire_ms]
        assert old.fired_ms is not None, "the old position is retired"


def test_a_row_placed_back_where_it_was_before_is_pending_there(pstore: Store):
    """Placed later, then placed again at the position it left (a steady rate computes
    the same time; a retry's backoff can too): the row written there is pending, not the
    retired row's "fired" read back."""
    with Client(pstore) as client:
        job = client.schedule("back", from_ms(SystemClock().now_ms() + 20_000), "k", {"n": 1})
        _place(pstore, _row_as_read(pstore, job), DEFERRED)
        [placed] = _pending_rows(pstore, "back", job)
        _place(pstore, _row_as_read(pstore, placed), DEFERRED, at_ms=job.fire_ms)
        [pending] = _pending_rows(pstore, "back", job)
        assert pending.fire_ms == job.fire_ms
        got = client.get("back")
        assert got is not None and got.status == Status.PENDING and got.fire_ms == job.fire_ms


@pytest.mark.parametrize("why", [HELD, DEFERRED])
def test_a_cancel_after_the_read_is_not_undone_by_the_placement(pstore: Store, why: str):
    with Client(pstore) as client:
        job = _job(client, "gone")
        row = _row_as_read(pstore, job)
        assert client.cancel("gone")
        _place(pstore, row, why)
        got = client.get("gone")
        assert got is not None and got.status == Status.CANCELLED
        assert _pending_rows(pstore, "gone", job) == []


@pytest.mark.parametrize("dead", [False, True], ids=["retry", "last-attempt"])
def test_a_failed_attempt_of_a_job_cancelled_while_it_ran_writes_nothing(pstore: Store, dead: bool):
    """The handler was running when the cancel landed, and failed. A retry would bring
    the cancelled job back as pending, to fire again; a last attempt's dead letter would
    mark it dead, and a replay would fire it. Neither is written."""
    with Client(pstore) as client:
        job = _job(client, "ran")
        row = _row_as_read(pstore, job)
        assert client.cancel("ran")
        now = SystemClock().now_ms()
        core = Core(pstore, SystemClock(), PollerConfig(), "p", PollerMetrics(), pstore.meta())
        retry_at = None if dead else now + 5_000
        core.outcomes.put([Outcome(row, False, "ValueError: boom", retry_at, dead, now)])
        assert Recorder(core).record_outcomes() == 1
        got = client.get("ran")
        assert got is not None and got.status == Status.CANCELLED
        assert _pending_rows(pstore, "ran", job) == []
        assert [d.job_id for d in client.dead_letters()] == []
        assert core.stats.retired_dropped == 1


def test_a_reschedule_after_the_read_keeps_only_the_new_time(pstore: Store):
    with Client(pstore) as client:
        job = _job(client, "moved")
        row = _row_as_read(pstore, job)
        later = client.reschedule("moved", from_ms(job.due_ms) + timedelta(seconds=50))
        _place(pstore, row, HELD)
        [pending] = _pending_rows(pstore, "moved", job)
        assert (pending.fire_ms, pending.due_ms) == (later.fire_ms, later.due_ms)
        got = client.get("moved")
        assert got is not None and got.due_ms == later.due_ms


def test_a_cancel_is_seen_past_a_full_page_of_other_kinds_rows(store_kind: str, request: Any,
                                                               tmp_path: Any):
    # The check reads each span a page at a time; a row a page past it (other kinds'
    # rows between two held ones) must be checked too, not placed unchecked.
    st = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=1, bucket_width_s=3600))
    try:
        now = SystemClock().now_ms()
        base = (now // 3_600_000 + 1) * 3_600_000 + 1000  # early in the next bucket
        with Client(st) as client:
            a = client.schedule("a-held", from_ms(base), "paused", {})
            client.schedule_many([JobSpec(f"filler-{i:03d}", from_ms(base + 1 + i), "other", {})
                                  for i in range(200)])
            b = client.schedule("b-held", from_ms(base + 500), "paused", {})
            [rows] = st.read_buckets([(a.bucket, a.shard, None, b.fire_ms)], 1000)
            held = [r for r in rows if r.job_id in ("a-held", "b-held")]
            assert client.cancel("b-held")
            t = SystemClock().now_ms()
            core = Core(st, SystemClock(), PollerConfig(), "p", PollerMetrics(), st.meta())
            core.outcomes.put([Outcome(r, False, HELD, t + HOLD_MS, False, t, WAIT) for r in held])
            assert Recorder(core).record_outcomes() == 2
            got_b, got_a = client.get("b-held"), client.get("a-held")
            assert got_b is not None and got_b.status == Status.CANCELLED
            assert got_a is not None and got_a.status == Status.PENDING and got_a.fire_ms != a.fire_ms
    finally:
        st.close()
