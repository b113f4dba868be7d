"""The producer client library: the only writer of jobs.

Synchronous and thread-safe; one store (so one Cassandra ``Cluster``) per ``Client``,
and one ``Client`` per process is the intended use.

Placement rule (the late-write rule): a job's fire time is its due time plus its
jitter, pushed forward to at least ``now + late_margin`` by the producer's clock. A
poller reads at most ``late_margin - 2 * max_skew`` ahead of its own clock and refuses to
fire with more than ``max_skew`` of skew, so every write acknowledged within ``max_skew``
lands ahead of every read cursor, in a bucket no poller has closed (later ones are
repaired by ``_repair_slow_writes``). A job due in
the past (or within the margin) therefore fires about ``late_margin`` after it was
scheduled, and keeps its original ``due_at`` for lateness accounting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from .clock import Clock, SystemClock
from .errors import ConfigError, InvalidInput, JobNotFound, ResizeRefused, StoreUnavailable, WriteTimeout
from .jobspec import JobSpec, spec_from_dict
from .keys import bucket_of_ms, jitter_ms, shard_of
from .layout import Layout, Layouts, check_resize, mark_end_for
from .model import Job, Status, check_due, check_job_id, check_kind, encode_payload
from .retention import check_expiry, format_duration
from .settings import Settings
from .store import Store, StoreMeta, open_store
from .store.base import DeadLetter

if TYPE_CHECKING:
    from .recurring.api import Recurring

log = logging.getLogger("scheduler.client")

MAX_JITTER_S = 86_400
# schedule_many works in chunks so a million-job load holds a bounded number in memory.
CHUNK = 5_000
NEAR_CHUNK = 200
NEAR_WINDOW_MS = 30_000
# How long a call rides out store errors before raising them (Client._retrying).
RETRY_S = 10.0
T = TypeVar("T")
# Failed writes whose placement a retry reuses (see Client._unsure): about 100 bytes each.
UNSURE_MAX = 100_000


class Client:
    """Schedule, cancel, reschedule and look up jobs.

    Every method validates its input before writing; an ``InvalidInput`` means nothing
    was written. Store failures raise ``StoreUnavailable`` or ``WriteTimeout`` (which
    says whether the write may have happened; every write here is safe to retry).
    """

    def __init__(self, store: Store | str | None = None, *, clock: Clock | None = None,
                 settings: Settings | None = None, max_payload_bytes: int | None = None,
                 bucket_width_s: int | None = None,
                 layout_cache_ttl_s: float | None = None, retry_s: float = RETRY_S) -> None:
        self.settings = settings or Settings.from_env()
        if isinstance(store, Store):
            self.store, self._owns_store = store, False
        else:
            url = self.settings.require_store(store)
            self.store = open_store(url, concurrency=self.settings.load_concurrency)
            self._owns_store = True
        self.clock: Clock = clock or SystemClock()
        self.max_payload_bytes = max_payload_bytes or self.settings.max_payload_bytes
        self.layout_cache_ttl_s = (self.settings.layout_cache_ttl_s if layout_cache_ttl_s is None
                                   else layout_cache_ttl_s)
        self._lock = threading.Lock()
        self._meta: StoreMeta = self.store.meta()
        if bucket_width_s is not None and bucket_width_s != self._meta.bucket_width_s:
            raise ConfigError(
                f"this client is configured for {bucket_width_s}s buckets but the store uses "
                f"{self._meta.bucket_width_s}s (fixed per keyspace); fix the client's bucket width"
            )
        self._layouts: Layouts | None = None
        self._layouts_at = 0.0
        self._marks: dict[int, int] = {}
        # Placements of writes that failed and may have been applied (WriteTimeout,
        # StoreUnavailable), by job id: a retry of the same call writes the same rows
        # again instead of placing a near-term job anew, which would leave the first
        # attempt's bucket row behind to fire a second time. Oldest dropped first.
        self._unsure: dict[str, Job] = {}
        self.retry_s = retry_s

    @property
    def meta(self) -> StoreMeta:
        return self._meta

    # --- layouts --------------------------------------------------------------------

    def layouts(self, fresh: bool = False) -> Layouts:
        """The cached layouts, reloaded once they are ``layout_cache_ttl_s`` old.

        A producer never writes with a copy older than that: if the reload fails, the
        error propagates and nothing is written. This is the bound a resize relies on.
        """
        with self._lock:
            age = self.clock.monotonic() - self._layouts_at
            if fresh or self._layouts is None or age >= self.layout_cache_ttl_s:
                self._layouts = self.store.layouts()
                self._layouts_at = self.clock.monotonic()
                for lay in self._layouts:
                    self._marks[lay.from_bucket] = max(self._marks.get(lay.from_bucket, 0),
                                                       lay.mark_end)
            return self._layouts

    def resize(self, count: int, at: datetime) -> Layout:
        """Change the shard count from the bucket starting at ``at`` on.

        Raises ``ResizeRefused`` naming the earliest allowed cutover when ``at`` is too
        early, not on a bucket boundary, or not after the latest layout.
        """
        at_ms = check_due(at)
        meta = self._meta
        layout = check_resize(self.layouts(fresh=True), count, at_ms, self.clock.now_ms(),
                              meta.bucket_width_s, int(self.layout_cache_ttl_s * 1000),
                              meta.late_margin_ms, meta.max_skew_ms)
        if not self.store.insert_layout(layout):
            raise ResizeRefused(f"a layout starting at {at.isoformat()} already exists")
        self.layouts(fresh=True)
        return layout

    # --- placement ------------------------------------------------------------------

    def build(self, spec: JobSpec, now_ms: int | None = None) -> Job:
        """Validate ``spec`` and place it (bucket, shard, fire time); writes nothing."""
        job_id = check_job_id(spec.job_id)
        kind = check_kind(spec.kind)
        due_ms = check_due(spec.due_at)
        if not 0 <= spec.jitter_s <= MAX_JITTER_S:
            raise InvalidInput(f"jitter must be between 0 and {MAX_JITTER_S} seconds, got {spec.jitter_s}")
        payload, is_json = encode_payload(spec.payload, self.max_payload_bytes)
        return self._place(job_id, kind, payload, is_json, due_ms, spec.jitter_s, now_ms)

    def _place(self, job_id: str, kind: str, payload: bytes, is_json: bool, due_ms: int,
               jitter_s: float, now_ms: int | None) -> Job:
        now = self.clock.now_ms() if now_ms is None else now_ms
        fire_ms = max(due_ms + jitter_ms(job_id, jitter_s), now + self._meta.late_margin_ms)
        check_expiry(fire_ms, self._meta.retention, now)
        bucket = bucket_of_ms(fire_ms, self._meta.bucket_width_s)
        layout = self.layouts().write_layout(bucket)
        return Job(job_id=job_id, kind=kind, data=payload, data_json=is_json, due_ms=due_ms,
                   fire_ms=fire_ms, bucket=bucket, shard=shard_of(job_id, layout.shard_count))

    def _ensure_marks(self, jobs: Iterable[Job]) -> None:
        """Record how far writers reached under each layout, before writing the jobs, so a
        reader of a later resize still reads the shards these jobs were written with."""
        layouts = self.layouts()
        needed: dict[int, int] = {}
        for job in jobs:
            lay = layouts.write_layout(job.bucket)
            end = mark_end_for(job.bucket)
            if end > self._marks.get(lay.from_bucket, 0) and end > needed.get(lay.from_bucket, 0):
                needed[lay.from_bucket] = end
        for from_bucket, end in needed.items():
            self.store.insert_mark(from_bucket, end)
            with self._lock:
                self._marks[from_bucket] = max(self._marks.get(from_bucket, 0), end)

    # --- writes ---------------------------------------------------------------------

    def schedule(self, job_id: str, due_at: datetime, kind: str, payload: Any = None, *,
                 jitter_s: float = 0.0) -> Job:
        """Schedule a job; idempotent by ``job_id``.

        Same id and same due time as a stored job: nothing changes and the stored job
        is returned (kind and payload of the first call stay). Different due time: a
        reschedule with this call's kind and payload, so the job fires once, at the new
        time. Returns the stored job.
        """
        return self.schedule_many([JobSpec(job_id, due_at, kind, payload, jitter_s)])[0]

    def schedule_many(self, specs: Iterable[JobSpec | dict[str, Any]],
                      progress: Callable[[int], None] | None = None) -> list[Job]:
        """Schedule many jobs with many writes in flight; returns the stored jobs in order.

        The whole input is validated first: one bad spec raises ``InvalidInput`` naming
        its position and nothing is written. A store error part-way leaves earlier
        chunks written; re-running the same call is safe.
        """
        now = self.clock.now_ms()
        jobs: list[Job] = []
        seen: set[str] = set()
        for i, raw in enumerate(specs):
            spec = raw if isinstance(raw, JobSpec) else spec_from_dict(raw, i)
            try:
                job = self.build(spec, now)
            except InvalidInput as exc:
                raise InvalidInput(f"job #{i + 1} ({spec.job_id!r}): {exc}") from None
            if job.job_id in seen:
                raise InvalidInput(f"job #{i + 1}: id {job.job_id!r} appears more than once")
            seen.add(job.job_id)
            jobs.append(job)
        # Jobs due soon go first, in small chunks: a chunk's write must be acknowledged
        # within max_skew for its near-term jobs to be safe where they were placed (see
        # _repair_slow_writes), and a big chunk takes longer than that.
        near_until = self.clock.now_ms() + self._meta.late_margin_ms + NEAR_WINDOW_MS
        order = sorted(range(len(jobs)), key=lambda i: jobs[i].fire_ms >= near_until)
        out: list[Job | None] = [None] * len(jobs)
        start = 0
        while start < len(order):
            size = NEAR_CHUNK if jobs[order[start]].fire_ms < near_until else CHUNK
            idx = order[start:start + size]
            chunk = [jobs[i] for i in idx]
            written = self._retrying(partial(self._write_chunk, chunk, progress))
            for i, job in zip(idx, written, strict=True):
                out[i] = job
            start += size
        return [j for j in out if j is not None]

    def _write_chunk(self, jobs: Sequence[Job], progress: Callable[[int], None] | None,
                     keep_existing: bool = False) -> list[Job]:
        # Place near-term jobs again with a fresh clock: a long load must not write a job
        # whose fire time has come within the late margin since validation.
        now = self.clock.now_ms()
        existing = self.store.get_many([j.job_id for j in jobs])
        with self._lock:
            unsure = {j.job_id: u for j in jobs
                      if j.job_id not in existing and (u := self._unsure.get(j.job_id)) is not None
                      and u.due_ms == j.due_ms and u.kind == j.kind and u.data == j.data}
        # A job whose earlier write may have landed keeps that placement (its rows are
        # written again, an idempotent upsert); _repair_slow_writes then moves it if it
        # is no longer safe there, retiring the earlier row in the same batch.
        jobs = [unsure.get(j.job_id) or self._replace_if_near(j, now) for j in jobs]
        fresh = [j for j in jobs if j.job_id not in existing]
        moved: list[tuple[Job, Job]] = []
        result: list[Job] = []
        for job in jobs:
            old = existing.get(job.job_id)
            if old is None:
                result.append(job)
            elif keep_existing or (old.due_ms == job.due_ms
                                   and not (old.status is Status.PENDING and self._at_risk(old, now))):
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
        self._ensure_marks([*fresh, *(n for _, n in moved)])
        try:
            if fresh:
                self.store.insert_many(fresh, progress)
            for old, new in moved:
                self.store.move(old, new)
        except (WriteTimeout, StoreUnavailable):
            with self._lock:
                for job in [*fresh, *(n for _, n in moved)]:
                    self._unsure[job.job_id] = job
                while len(self._unsure) > UNSURE_MAX:
                    del self._unsure[next(iter(self._unsure))]
            raise
        if unsure:
            with self._lock:
                for job_id in unsure:
                    self._unsure.pop(job_id, None)
        if progress and len(jobs) > len(fresh):
            progress(len(jobs) - len(fresh))
        return self._repair_slow_writes(result, {j.job_id for j in fresh} | {n.job_id for _, n in moved})

    @property
    def recurring(self) -> Recurring:
        """Recurring schedules: create, update, pause, resume, delete, get, list."""
        from .recurring.api import Recurring

        return Recurring(self)

    def _replace_if_near(self, job: Job, now: int) -> Job:
        if job.fire_ms >= now + self._meta.late_margin_ms:
            return job
        # Jitter is dropped: the job lands at now + margin, its earliest safe position.
        return self._place(job.job_id, job.kind, job.data, job.data_json, job.due_ms, 0, now)

    def _at_risk(self, job: Job, ack_ms: int) -> bool:
        """Could a poller have read past this job's position before the write was visible?

        A poller reads at most ``late_margin - 2 * max_skew`` ahead of its clock, which is
        at most ``max_skew`` ahead of ours: positions up to ``ack + margin - max_skew``
        may already be behind a cursor when the write became visible at ``ack``.
        """
        return job.fire_ms <= ack_ms + self._meta.late_margin_ms - self._meta.max_skew_ms

    def _repair_slow_writes(self, result: list[Job], written: set[str]) -> list[Job]:
        """Move jobs whose write was acknowledged too late to be safe (a slow write, a
        long pause) to a fresh position ahead of every cursor. The old row may still
        fire too: a duplicate, never a loss."""
        out = list(result)
        for _ in range(5):
            ack = self.clock.now_ms()
            risky = [i for i, j in enumerate(out) if j.job_id in written and self._at_risk(j, ack)]
            if not risky:
                break
            for i in risky:
                old = out[i]
                new = self._replace_if_near(old.evolve(fire_ms=0), ack)
                self.store.move(old, new)
                out[i] = new
            log.warning("moved %d jobs whose write was acknowledged late", len(risky),
                        extra={"action": "slow_write_repaired", "jobs": len(risky)})
        return out

    def reschedule(self, job_id: str, due_at: datetime, *, jitter_s: float = 0.0) -> Job:
        """Move a job to a new due time; it fires once, at the new time.

        A fired, cancelled or dead job is re-armed. Raises ``JobNotFound``.
        """
        check_job_id(job_id)
        due_ms = check_due(due_at)
        old = self.get(job_id)
        new = self._place(job_id, old.kind, old.data, old.data_json, due_ms, jitter_s, None)
        if old.status is Status.PENDING and old.due_ms == due_ms:
            return old
        new = new.evolve(attempts=old.attempts, fired_ms=old.fired_ms, last_error=old.last_error)
        self._ensure_marks([new])
        self._retrying(lambda: self.store.move(old, new))
        return new

    def cancel(self, job_id: str) -> bool:
        """Cancel a pending job; True when this call cancelled it.

        A job a poller has already read for firing (it is due within the prefetch
        window, 2 s by default) may still fire once.
        """
        check_job_id(job_id)
        job = self._retrying(lambda: self.store.get(job_id))
        if job is None or job.status is not Status.PENDING:
            return False
        self._retrying(lambda: self.store.cancel(job))
        return True

    def dead_letters(self) -> list[DeadLetter]:
        """Jobs whose retries ran out or whose kind had no handler."""
        return sorted(self.store.dead_letters(), key=lambda d: d.died_ms)

    def replay_dead(self, job_ids: Sequence[str] | None = None, at: datetime | None = None) -> list[Job]:
        """Re-arm dead jobs (all when ``job_ids`` is None) at ``at`` (default: now), with
        their attempts reset, and remove them from the dead letters."""
        due_ms = self.clock.now_ms() if at is None else check_due(at)
        dead = {d.job_id: d for d in self.store.dead_letters()}
        wanted = list(dead) if job_ids is None else list(job_ids)
        missing = [j for j in wanted if j not in dead]
        if missing:
            raise JobNotFound(f"not in the dead letters: {', '.join(missing[:5])}")
        out = []
        for job_id in wanted:
            old = self.get(job_id)
            new = self._place(job_id, old.kind, old.data, old.data_json, due_ms, 0, None)
            new = new.evolve(attempts=0, fired_ms=old.fired_ms, last_error=old.last_error)
            self._ensure_marks([new])
            self.store.move(old, new)
            self.store.delete_dead_letter(job_id)
            out.append(new)
        return out

    def get(self, job_id: str) -> Job:
        """The stored job with its status and history; raises ``JobNotFound``."""
        check_job_id(job_id)
        job = self._retrying(lambda: self.store.get(job_id))
        if job is None:
            raise JobNotFound(
                f"no job with id {job_id!r}: unknown, or expired (a job is kept "
                f"{format_duration(self._meta.retention_s)} after it fires, is cancelled or dies)")
        return job

    def _retrying(self, call: Callable[[], T]) -> T:
        """``call()``, repeated on ``WriteTimeout`` or ``StoreUnavailable`` for up to
        ``retry_s`` seconds (0.1 s apart, doubling to 1 s); then the last error is raised.

        Every call passed here is idempotent. It rides out the seconds after a Cassandra
        node dies, before the failure detector convicts it, when coordinators still pick
        it (measured: a logged batch timed out on both live coordinators in a row), and a
        restarted node that has not caught up on the schema yet. A store that is really
        down still raises, ``retry_s`` later.
        """
        deadline = time.monotonic() + self.retry_s
        delay = 0.1
        while True:
            try:
                return call()
            except (WriteTimeout, StoreUnavailable):
                if time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(1.0, delay * 2)

    def close(self) -> None:
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
