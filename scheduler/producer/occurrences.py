"""Placing and writing occurrences: the producer's rules (layouts, marks, late writes)
through the ``Producer`` that owns them, plus the one thing occurrences do differently:
every writer places one identically, so most are written blind. Effect generators
(``scheduler.domain.effects``): a client drives them, e.g. ``client.run(write(client.producer, jobs))``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..domain.effects import Steps, call
from ..domain.model import Job
from ..recurring.schedule import WRITE_TIME_SLACK_MS, Schedule, occurrence_id
from . import repair

if TYPE_CHECKING:
    from .producer import Producer


def place(producer: Producer, schedule: Schedule, nominal_ms: int, now_ms: int | None = None) -> Steps[Job]:
    """The job of ``schedule``'s occurrence at ``nominal_ms``: its id, kind and payload
    from the schedule, due at the nominal time, fired at the nominal time plus the
    schedule's deterministic jitter (the late-write rule applies), with the schedule's
    priority and key (so in the key's shard when it has one)."""
    oid = occurrence_id(schedule.schedule_id, schedule.version, nominal_ms)
    return (yield from producer.place(oid, schedule.kind, schedule.payload, schedule.payload_json,
                                      nominal_ms, schedule.jitter_s, schedule.priority, schedule.key,
                                      now_ms))


def write(producer: Producer, jobs: Sequence[Job]) -> Steps[list[Job]]:
    """Write placed occurrences, leaving any that exists as it is. No retries: a store
    error propagates (the caller retries; every write here is idempotent).

    An occurrence placed at its own time (not moved by the late-write rule) was placed
    there by every earlier writer too, so it is written blind, without a read
    (``Store.insert_once``). Its write time is earlier than any change to it: only
    pollers change an occurrence (``cancel`` refuses their ids), after reading it, which
    is never before its due time minus the late margin and the clock skew. One within
    the late margin may have been placed elsewhere by another writer: it is looked up
    first, as ``schedule_many`` does, and an existing one is kept."""
    if not jobs:
        return []
    margin = producer.meta.late_margin_ms
    now = producer.clock.now_ms()
    # Strictly later: one the late-write rule moved sits at (its placement's now) + margin.
    far = [j for j in jobs if j.fire_ms > now + margin]
    near = [j for j in jobs if j.fire_ms <= now + margin]
    out = (yield from producer.write_chunk(near, None, keep_existing=True)) if near else []
    if far:
        yield from producer.ensure_marks(far)
        written = min(now, *(j.due_ms for j in far)) - margin - WRITE_TIME_SLACK_MS
        yield from call("insert_once", far, written)
        out += yield from repair.repair_slow_writes(producer, far, {j.job_id for j in far}, now)
    return out
