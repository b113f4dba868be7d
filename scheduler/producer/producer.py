"""The producer's rules, written once for ``Client`` and ``AsyncClient``: validation,
placement (the late-write rule), layout marks, retries of uncertain writes, and moves
of writes acknowledged too late. Every operation is a generator of effects
(``scheduler.domain.effects``); the clients only drive them.

Placement rule (the late-write rule): a job's fire time is its due time plus its
jitter, pushed forward to at least ``now + late_margin`` by the producer's clock. A
poller reads at most ``late_margin - 2 * max_skew`` ahead of its own clock and refuses to
fire with more than ``max_skew`` of skew, so every write acknowledged within ``max_skew``
lands ahead of every read cursor, in a bucket no poller has closed (later ones are
repaired by ``repair_slow_writes``). A job due in the past (or within the margin)
therefore fires about ``late_margin`` after it was scheduled, and keeps its original
``due_at`` for lateness accounting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from ..domain.clock import Clock
from ..domain.effects import Sleep, Steps, call
from ..domain.flow import check_key, check_priority
from ..domain.httptarget import HTTP_KIND, check_schedulable
from ..domain.jobspec import JobSpec, spec_from_dict
from ..domain.keys import bucket_of_ms, jitter_ms, shard_key
from ..domain.layout import Layout, Layouts, check_resize, mark_end_for
from ..domain.model import (
    Job,
    Status,
    check_due,
    check_job_id,
    check_kind,
    check_stored_id,
    encode_payload,
)
from ..domain.netguard import AllowList
from ..domain.retention import check_expiry, format_duration
from ..errors import (
    ConfigError,
    InvalidInput,
    JobNotFound,
    ResizeRefused,
    SchedulerError,
    StoreUnavailable,
    WriteTimeout,
)
from ..store import StoreMeta
from . import repair
from .nudger import Nudger

log = logging.getLogger("scheduler.client")

MAX_JITTER_S = 86_400
# schedule_many works in chunks so a million-job load holds a bounded number in memory.
CHUNK = 5_000
NEAR_CHUNK = 200
NEAR_WINDOW_MS = 30_000
# How long a call rides out store errors before raising them (Producer.retrying).
RETRY_S = 10.0
# Tries at least, whatever retry_s: a single timeout (the driver's request timeout is
# also 10 s) must not use the whole budget when the next try would go to a live node.
MIN_TRIES = 3
T = TypeVar("T")
ProgressFn = Callable[[int], None]
# A validated job before placement: id, kind, payload, payload is JSON, due ms, jitter s,
# priority, key.
Placeable = tuple[str, str, bytes, bool, int, float, int, str | None]


class Producer:
    """The state a client keeps (keyspace settings, cached layouts and marks, uncertain
    writes) and its operations as effect generators. Thread-safe, and safe to share
    between tasks of one event loop: the lock is never held across a ``yield``."""

    def __init__(self, meta: StoreMeta, clock: Clock, *, max_payload_bytes: int,
                 layout_cache_ttl_s: float, retry_s: float, bucket_width_s: int | None = None,
                 nudge: bool = True, http_allow: AllowList | None = None) -> None:
        """``http_allow``: the exceptions to the guard of HTTP targets (none: nothing)."""
        if bucket_width_s is not None and bucket_width_s != meta.bucket_width_s:
            raise ConfigError(
                f"this client is configured for {bucket_width_s}s buckets but the store uses "
                f"{meta.bucket_width_s}s (fixed per keyspace); fix the client's bucket width"
            )
        self.meta = meta
        self.clock = clock
        self.max_payload_bytes = max_payload_bytes
        self.layout_cache_ttl_s = layout_cache_ttl_s
        self.retry_s = retry_s
        self.http_allow = http_allow or AllowList()
        self._lock = threading.Lock()
        self._layouts: Layouts | None = None
        self._layouts_at = 0.0
        self._marks: dict[int, int] = {}
        self.unsure = repair.Unsure()  # failed writes' placements, for their retries
        # The due-now fast path: tell shard owners about jobs placed by the late-write rule.
        self.nudger = Nudger(clock, meta.late_margin_ms) if nudge else None

    # --- layouts --------------------------------------------------------------------

    def layouts(self, fresh: bool = False) -> Steps[Layouts]:
        """The cached layouts, reloaded once they are ``layout_cache_ttl_s`` old.

        A producer never writes with a copy older than that: if the reload fails, the
        error propagates and nothing is written. This is the bound a resize relies on.
        """
        cached = self._layouts
        age = self.clock.monotonic() - self._layouts_at
        if not fresh and cached is not None and age < self.layout_cache_ttl_s:
            return cached
        found: Layouts = yield from call("layouts")
        with self._lock:
            self._layouts, self._layouts_at = found, self.clock.monotonic()
            for lay in found:
                self._marks[lay.from_bucket] = max(self._marks.get(lay.from_bucket, 0), lay.mark_end)
        return found

    def resize(self, count: int, at: datetime) -> Steps[Layout]:
        """Change the shard count from the bucket starting at ``at`` on.

        Raises ``ResizeRefused`` naming the earliest allowed cutover when ``at`` is too
        early, not on a bucket boundary, or not after the latest layout.
        """
        at_ms = check_due(at)
        meta = self.meta
        current = yield from self.layouts(fresh=True)
        layout = check_resize(current, count, at_ms, self.clock.now_ms(), meta.bucket_width_s,
                              int(self.layout_cache_ttl_s * 1000), meta.late_margin_ms, meta.max_skew_ms)
        if not (yield from call("insert_layout", layout)):
            raise ResizeRefused(f"a layout starting at {at.isoformat()} already exists")
        yield from self.layouts(fresh=True)
        return layout

    # --- placement ------------------------------------------------------------------

    def check(self, spec: JobSpec) -> Placeable:
        """``spec`` validated, as ``place``'s arguments; raises ``InvalidInput``. Pure."""
        job_id = check_job_id(spec.job_id)
        kind = check_kind(spec.kind)
        if kind == HTTP_KIND:
            check_schedulable(spec.payload, self.http_allow)
        due_ms = check_due(spec.due_at)
        if not 0 <= spec.jitter_s <= MAX_JITTER_S:
            raise InvalidInput(f"jitter must be between 0 and {MAX_JITTER_S} seconds, got {spec.jitter_s}")
        payload, is_json = encode_payload(spec.payload, self.max_payload_bytes)
        key = None if spec.key is None else check_key(spec.key)
        return job_id, kind, payload, is_json, due_ms, spec.jitter_s, check_priority(spec.priority), key

    def build(self, spec: JobSpec, now_ms: int | None = None,
              traceparent: str | None = None) -> Steps[Job]:
        """Validate ``spec`` and place it (bucket, shard, fire time); writes nothing."""
        return (yield from self.place(*self.check(spec), now_ms, traceparent=traceparent))

    def place(self, job_id: str, kind: str, payload: bytes, is_json: bool, due_ms: int,
              jitter_s: float, priority: int, key: str | None, now_ms: int | None, *,
              traceparent: str | None = None) -> Steps[Job]:
        """The job placed: fire time (the late-write rule), bucket, and the shard of its
        key, or of its id when it has none (``keys.shard_key``). Writes nothing.
        ``traceparent``: the producer's span, stored with the job (``observe.tracing``)."""
        layouts = yield from self.layouts()
        now = self.clock.now_ms() if now_ms is None else now_ms
        fire_ms = max(due_ms + jitter_ms(job_id, jitter_s), now + self.meta.late_margin_ms)
        check_expiry(fire_ms, self.meta.retention, now)
        bucket = bucket_of_ms(fire_ms, self.meta.bucket_width_s)
        layout = layouts.write_layout(bucket)
        return Job(job_id=job_id, kind=kind, data=payload, data_json=is_json, due_ms=due_ms,
                   fire_ms=fire_ms, bucket=bucket, shard=shard_key(job_id, key, layout.shard_count),
                   priority=priority, key=key, traceparent=traceparent)

    def ensure_marks(self, jobs: Iterable[Job]) -> Steps[None]:
        """Record how far writers reached under each layout, before writing the jobs, so a
        reader of a later resize still reads the shards these jobs were written with."""
        layouts = yield from self.layouts()
        needed: dict[int, int] = {}
        for job in jobs:
            lay = layouts.write_layout(job.bucket)
            end = mark_end_for(job.bucket)
            if end > self._marks.get(lay.from_bucket, 0) and end > needed.get(lay.from_bucket, 0):
                needed[lay.from_bucket] = end
        for from_bucket, end in needed.items():
            yield from call("insert_mark", from_bucket, end)
            with self._lock:
                self._marks[from_bucket] = max(self._marks.get(from_bucket, 0), end)

    # --- writes ---------------------------------------------------------------------

    def schedule_many(self, specs: Iterable[JobSpec | dict[str, Any]],
                      progress: ProgressFn | None = None,
                      traceparent: str | None = None) -> Steps[list[Job]]:
        """See ``Client.schedule_many``; every job stores ``traceparent``."""
        now = self.clock.now_ms()
        jobs: list[Job] = []
        seen: set[str] = set()
        for i, raw in enumerate(specs):
            spec = raw if isinstance(raw, JobSpec) else spec_from_dict(raw, i)
            try:
                job = yield from self.build(spec, now, traceparent)
            except InvalidInput as exc:
                raise InvalidInput(f"job #{i + 1} ({spec.job_id!r}): {exc}") from None
            if job.job_id in seen:
                raise InvalidInput(f"job #{i + 1}: id {job.job_id!r} appears more than once")
            seen.add(job.job_id)
            jobs.append(job)
        return (yield from self.write_jobs(jobs, progress))

    def write_jobs(self, jobs: list[Job], progress: ProgressFn | None = None) -> Steps[list[Job]]:
        """Write placed jobs (``build``), distinct ids; returns the stored jobs in order."""
        # Jobs due soon go first, in small chunks: a chunk's write must be acknowledged
        # within max_skew for its near-term jobs to be safe where they were placed (see
        # repair_slow_writes), and a big chunk takes longer than that.
        near_until = self.clock.now_ms() + self.meta.late_margin_ms + NEAR_WINDOW_MS
        order = sorted(range(len(jobs)), key=lambda i: jobs[i].fire_ms >= near_until)
        out: list[Job | None] = [None] * len(jobs)
        start = 0
        while start < len(order):
            size = NEAR_CHUNK if jobs[order[start]].fire_ms < near_until else CHUNK
            idx = order[start:start + size]
            chunk = [jobs[i] for i in idx]
            written = yield from self.retrying(partial(self.write_chunk, chunk, progress))
            if self.nudger is not None:
                yield from self.nudger.nudge(written)
            for i, job in zip(idx, written, strict=True):
                out[i] = job
            start += size
        return [j for j in out if j is not None]

    def write_chunk(self, jobs: Sequence[Job], progress: ProgressFn | None,
                    keep_existing: bool = False) -> Steps[list[Job]]:
        existing: dict[str, Job] = yield from call("get_many", [j.job_id for j in jobs])
        if self.nudger is not None:
            yield from self.nudger.prepare(jobs)
        # Place near-term jobs again with a fresh clock, read after the lookup (the first
        # read of a fresh process can take hundreds of milliseconds): a long load must not
        # write a job whose fire time has come within the late margin since validation.
        now = self.clock.now_ms()
        # A job whose earlier write or move may have landed keeps that placement (see
        # repair.Unsure); repair_slow_writes then moves it if it is no longer safe there.
        unsure = self.unsure.reuse(jobs, existing)
        placed = []
        for j in jobs:
            placed.append(unsure.get(j.job_id) or (yield from self.replace_if_near(j, now)))
        fresh = [j for j in placed if j.job_id not in existing]
        moved: list[tuple[Job, Job]] = []
        result: list[Job] = []
        for job in placed:
            old = existing.get(job.job_id)
            if old is None:
                result.append(job)
            elif keep_existing or (old.due_ms == job.due_ms and not (
                    old.status is Status.PENDING and repair.at_risk(self.meta, old, now))):
                # (An occurrence's row is the same row whoever writes it: moving one a
                # poller may already hold would fire it twice.)
                result.append(old)
            else:
                # A new due time (the latest call's kind and payload win; history is kept),
                # or a retry of a write that may have landed behind a poller's cursor.
                new = job.evolve(attempts=old.attempts, fired_ms=old.fired_ms,
                                 last_error=old.last_error, status=Status.PENDING)
                moved.append((old, new))
                result.append(new)
        yield from self.ensure_marks([*fresh, *(n for _, n in moved)])
        try:
            if fresh:
                yield from call("insert_many", fresh, progress)
            if moved:
                retire = self.nudger.retire if self.nudger is not None else None
                try:
                    yield from call("move_many", moved)
                except SchedulerError:
                    # Some pairs may have landed: tell their owners all the same (each
                    # checks the store before dropping anything).
                    if retire is not None:
                        yield from retire([old for old, _ in moved])
                    raise
                if retire is not None:
                    yield from retire([old for old, _ in moved])
        except (WriteTimeout, StoreUnavailable):
            self.unsure.note([*((None, j) for j in fresh), *moved])
            raise
        if progress and len(placed) > len(fresh):
            progress(len(placed) - len(fresh))
        written = {j.job_id for j in fresh} | {n.job_id for _, n in moved}
        out = yield from repair.repair_slow_writes(self, result, written, now)
        self.unsure.forget(unsure)  # written (a failed repair round noted its own)
        return out

    def replace_if_near(self, job: Job, now: int) -> Steps[Job]:
        if job.fire_ms >= now + self.meta.late_margin_ms:
            return job
        # Jitter is dropped: the job lands at now + margin, its earliest safe position.
        return (yield from self.place(job.job_id, job.kind, job.data, job.data_json, job.due_ms, 0,
                                      job.priority, job.key, now, traceparent=job.traceparent))

    def reschedule(self, job_id: str, due_at: datetime, jitter_s: float,
                   traceparent: str | None = None) -> Steps[Job]:
        """See ``Client.reschedule``. The job stores ``traceparent`` (the rescheduling
        span's) in place of its own; None keeps the one it has."""
        check_job_id(job_id)
        due_ms = check_due(due_at)
        old = yield from self.get(job_id)
        new = yield from self.place(job_id, old.kind, old.data, old.data_json, due_ms, jitter_s,
                                    old.priority, old.key, None,
                                    traceparent=traceparent or old.traceparent)
        if old.status is Status.PENDING and old.due_ms == due_ms:
            return old
        new = new.evolve(attempts=old.attempts, fired_ms=old.fired_ms, last_error=old.last_error)
        yield from self.ensure_marks([new])
        yield from self.retrying(lambda: call("move", old, new))
        if old.status is Status.DEAD:  # armed again: no longer a dead letter to replay
            yield from self.retrying(lambda: call("delete_dead_letter", job_id))
        if self.nudger is not None:
            if old.status is Status.PENDING:
                yield from self.nudger.retire([old])
            yield from self.nudger.nudge([new])
        return new

    def cancel(self, job_id: str) -> Steps[bool]:
        """See ``Client.cancel``."""
        check_job_id(job_id)
        job = yield from self.retrying(lambda: call("get", job_id))
        if job is None or job.status is not Status.PENDING:
            return False
        yield from self.retrying(lambda: call("cancel", job))
        if self.nudger is not None:
            yield from self.nudger.retire([job])
        return True

    def get(self, job_id: str) -> Steps[Job]:
        """The stored job (an occurrence of a recurring schedule too); raises
        ``JobNotFound``."""
        check_stored_id(job_id)
        job = yield from self.retrying(lambda: call("get", job_id))
        if job is None:
            raise JobNotFound(
                f"no job with id {job_id!r}: unknown, or expired (a job is kept "
                f"{format_duration(self.meta.retention_s)} after it fires, is cancelled or dies)")
        return job  # type: ignore[no-any-return]

    def retrying(self, make: Callable[[], Steps[T]]) -> Steps[T]:
        """``make()``'s steps, run again on ``WriteTimeout`` or ``StoreUnavailable`` for
        up to ``retry_s`` seconds (0.1 s apart, doubling to 1 s), and at least
        ``MIN_TRIES`` times unless ``retry_s`` is 0 (the caller retries); then the last
        error is raised.

        Every operation passed here is idempotent. It rides out the seconds after a
        Cassandra node dies, before the failure detector convicts it, when coordinators
        still pick it (measured: a logged batch timed out on both live coordinators in a
        row), and a restarted node that has not caught up on the schema yet. A store
        that is really down still raises, ``retry_s`` later.
        """
        deadline = time.monotonic() + self.retry_s
        delay, tries = 0.1, 0
        while True:
            try:
                return (yield from make())
            except (WriteTimeout, StoreUnavailable):
                tries += 1
                if (tries >= MIN_TRIES or self.retry_s <= 0) and time.monotonic() + delay > deadline:
                    raise
            yield Sleep(delay)
            delay = min(1.0, delay * 2)
