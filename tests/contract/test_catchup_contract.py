"""The catch-up after a fail-back, on both stores: of a shard's buckets it finds exactly
the rows the audit calls lost (pending behind the checkpoint, their lookup rows still
naming them), and moves them ahead of every cursor with their id and due time, so the
audit finds nothing afterwards and a second catch-up moves nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from scheduler.domain.clock import FakeClock
from scheduler.domain.effects import run_sync
from scheduler.domain.model import Status
from scheduler.domain.progress import Checkpoint
from scheduler.observe.audit import audit, behind
from scheduler.producer.producer import Producer
from scheduler.producer.repair import requeue
from scheduler.store import SchemaOptions, Store
from tests.conftest import bucket_job, make_store

T0_MS = 1_800_000_000_000  # a bucket boundary (60 s buckets)
B0 = T0_MS // 1000
S = 2
NOW_MS = T0_MS + 125_000  # the fail-back: two buckets later


@pytest.fixture
def st(store_kind: str, request: Any, tmp_path: Any) -> Iterator[Store]:
    s = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=S), now_ms=T0_MS)
    yield s
    s.close()


job = bucket_job


def producer(st: Store) -> Producer:
    return Producer(st.meta(), FakeClock(NOW_MS), max_payload_bytes=1 << 20, layout_cache_ttl_s=60,
                    retry_s=0, nudge=False)


def test_finds_the_lost_rows_of_the_shard_alone_and_moves_them_ahead_keeping_their_due_time(st: Store):
    fired, cancelled = job("fired", T0_MS + 1000), job("cancelled", T0_MS + 2000)
    moved = job("moved", T0_MS + 3000)
    ahead = job("ahead", T0_MS + 125_000 + 30_000)  # in a bucket the checkpoint has not passed
    st.insert_many([fired, cancelled, moved, ahead])
    st.record_fired([fired], T0_MS + 1500)
    st.cancel(cancelled)
    st.move(moved, job("moved", T0_MS + 200_000))
    st.claim_shard(0, "p0", 5, B0 - 60, T0_MS)
    st.save_checkpoint(0, 5, Checkpoint(B0 + 60), T0_MS + 121_000)  # two buckets drained
    # Rows that reached this DC only after the other one drained their buckets.
    lost = [job("lost-a", T0_MS + 4000), job("lost-b", T0_MS + 64_000), job("lost-c", T0_MS + 64_000)]
    other = job("other-shard", T0_MS + 5000, shard=1)
    st.insert_many([*lost, other])

    found = behind(st, 0, B0, B0 + 120)
    assert sorted(r.job_id for r in found) == ["lost-a", "lost-b", "lost-c"]
    assert behind(st, 0, B0 + 60, B0 + 60) == [r for r in found if r.bucket == B0 + 60]

    new = run_sync(st, requeue(producer(st), found))
    assert sorted(j.job_id for j in new) == ["lost-a", "lost-b", "lost-c"]
    margin = st.meta().late_margin_ms
    stored = st.get_many([j.job_id for j in lost])
    for old in lost:
        j = stored[old.job_id]
        assert j.status is Status.PENDING and j.due_ms == old.due_ms
        assert NOW_MS + margin <= j.fire_ms <= NOW_MS + margin + 1000, "moved ahead of every cursor"
    report = audit(st, T0_MS, T0_MS + 179_999)
    assert not report.violations
    assert report.totals()["moved"] == 4  # the three caught up, and the one moved before
    assert behind(st, 0, B0, B0 + 120) == []  # a second catch-up moves nothing
    assert run_sync(st, requeue(producer(st), [])) == []


def test_a_shard_without_a_checkpoint_or_a_window_of_another_layout_finds_nothing(st: Store):
    st.insert_many([job("x", T0_MS + 4000, shard=1)])
    assert behind(st, 1, B0, B0 + 60) == []  # shard 1 was never claimed: nothing passed
    assert behind(st, S + 3, B0, B0 + 60) == []  # no such shard in these buckets' layout


def test_a_row_cancelled_or_moved_between_the_read_and_the_move_is_left_alone(st: Store):
    st.claim_shard(0, "p0", 5, B0 - 60, T0_MS)
    st.save_checkpoint(0, 5, Checkpoint(B0), T0_MS + 61_000)
    cancelled, moved = job("lost-cancelled", T0_MS + 4000), job("lost-moved", T0_MS + 5000)
    st.insert_many([cancelled, moved])
    found = behind(st, 0, B0, B0)
    assert sorted(r.job_id for r in found) == ["lost-cancelled", "lost-moved"]
    # The producers act after the catch-up read the rows, before it moves them.
    st.cancel(cancelled)
    later = job("lost-moved", T0_MS + 600_000)
    st.move(moved, later)
    assert run_sync(st, requeue(producer(st), found)) == []
    stored = st.get_many(["lost-cancelled", "lost-moved"])
    assert stored["lost-cancelled"].status is Status.CANCELLED
    assert stored["lost-moved"].fire_ms == later.fire_ms and stored["lost-moved"].status is Status.PENDING
