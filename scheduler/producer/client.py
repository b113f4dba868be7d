"""The producer client library: the only writer of jobs.

``Client`` is synchronous and thread-safe; ``AsyncClient`` (``scheduler.producer.aclient``) is
its asyncio twin. Both drive the same rules, in ``scheduler.producer.producer`` (placement, the
late-write rule, layout marks, retries); this module only performs their I/O. One
store (so one Cassandra ``Cluster``) per client, and one client per process is the
intended use.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from ..domain.clock import Clock, SystemClock
from ..domain.effects import Steps, run_sync
from ..domain.flow import DEFAULT_PRIORITY
from ..domain.jobspec import JobSpec
from ..domain.layout import Layout, Layouts
from ..domain.model import Job
from ..domain.topology import check_dc, parse_write_consistency
from ..errors import ConfigError, StoreUnavailable, WriteTimeout
from ..observe import tracing
from ..observe.tracing import producer_span
from ..settings import Settings, cassandra_security
from ..store import Store, StoreMeta, open_store
from ..store.base import DeadLetter
from ..store.roles import Meta
from .jobview import JobView, describe
from .producer import MIN_TRIES, RETRY_S, Producer
from .recurring import Recurring
from .replay import replay_dead

T = TypeVar("T")


def open_producer(store: Store | str | None, clock: Clock | None, settings: Settings | None,
                  max_payload_bytes: int | None, bucket_width_s: int | None,
                  layout_cache_ttl_s: float | None, retry_s: float, dc: str | None = None,
                  consistency: str | None = None) -> tuple[Store, bool, Producer]:
    """The store (opened from a URL, or the one given: then not owned) and the rules
    for it; shared by both clients. ``dc`` and ``consistency`` (else SCHEDULER_DC and
    SCHEDULER_WRITE_CONSISTENCY) apply to a Cassandra store opened here; the embedded
    store ignores them. Raises what ``open_store`` and ``meta`` raise, and
    ``ConfigError`` for a bad ``dc`` or ``consistency``, or either given with a store
    object (whose connection is already made)."""
    settings = settings or Settings.from_env()
    if dc is not None:
        check_dc(dc, "dc=")
    if consistency is not None:
        parse_write_consistency(consistency, "consistency=")
    if isinstance(store, Store):
        if dc is not None or consistency is not None:
            raise ConfigError("dc= and consistency= apply to a store the client opens: pass the store "
                              "URL, or open the store with them")
        st, owns = store, False
    else:
        # create=False: a client never makes a store (``schema apply`` does); an embedded
        # store's missing file stays missing rather than appearing empty.
        st, owns = open_store(settings.require_store(store), create=False,
                              concurrency=settings.load_concurrency, security=cassandra_security(),
                              dc=dc if dc is not None else settings.dc,
                              consistency=consistency if consistency is not None
                              else settings.write_consistency), True
    try:
        producer = Producer(
            read_meta(st, retry_s), clock or SystemClock(),
            max_payload_bytes=max_payload_bytes or settings.max_payload_bytes,
            layout_cache_ttl_s=(settings.layout_cache_ttl_s if layout_cache_ttl_s is None
                                else layout_cache_ttl_s),
            retry_s=retry_s, bucket_width_s=bucket_width_s, nudge=settings.nudge,
            http_allow=settings.http_allow)
    except BaseException:
        if owns:
            st.close()
        raise
    return st, owns, producer


def read_meta(store: Meta, retry_s: float) -> StoreMeta:
    """``store.meta()``, tried again on a timeout or an unavailable store for up to
    ``retry_s`` seconds (0.1 s apart, doubling to 1 s), as every later call is: a
    short-lived producer started while a node dies must not fail on its first read."""
    deadline = time.monotonic() + retry_s
    delay, tries = 0.1, 0
    while True:
        try:
            return store.meta()
        except (WriteTimeout, StoreUnavailable):
            tries += 1
            # At least MIN_TRIES: one timeout (the driver's 10 s) can use the whole budget
            # on a node that died a moment ago; the next try goes to another one.
            if (tries >= MIN_TRIES or retry_s <= 0) and time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(1.0, delay * 2)


class ClientBase:
    """What both clients hold: the store (owned when opened from a URL) and the rules."""

    def __init__(self, store: Store | str | None = None, *, clock: Clock | None = None,
                 settings: Settings | None = None, max_payload_bytes: int | None = None,
                 bucket_width_s: int | None = None,
                 layout_cache_ttl_s: float | None = None, retry_s: float = RETRY_S,
                 dc: str | None = None, consistency: str | None = None) -> None:
        """``dc``: the Cassandra DC this client talks to (token-aware routing over its
        nodes, LOCAL_QUORUM); ``consistency``: ``local_quorum`` (default) or
        ``each_quorum`` for writes. See ``open_producer``."""
        self.store, self._owns_store, self.producer = open_producer(
            store, clock, settings, max_payload_bytes, bucket_width_s, layout_cache_ttl_s, retry_s,
            dc, consistency)
        self.clock: Clock = self.producer.clock
        # Spans are exported when the OTEL_* variables name an endpoint (observe.tracing).
        tracing.setup()
        self._setup()

    def _setup(self) -> None:
        """A subclass's own state (the async client's group writes)."""

    @property
    def meta(self) -> StoreMeta:
        return self.producer.meta

    def _close(self) -> None:
        if self.producer.nudger is not None:
            self.producer.nudger.close()
        if self._owns_store:
            self.store.close()


class Client(ClientBase):
    """Schedule, cancel, reschedule and look up jobs.

    Every method validates its input before writing; an ``InvalidInput`` means nothing
    was written. Store failures raise ``StoreUnavailable`` or ``WriteTimeout`` (which
    says whether the write may have happened; every write here is safe to retry).
    """

    def run(self, steps: Steps[T]) -> T:
        """Perform an operation of ``Producer`` (or of the recurring API) on the store."""
        return run_sync(self.store, steps)

    def layouts(self, fresh: bool = False) -> Layouts:
        """The cached layouts, reloaded once they are ``layout_cache_ttl_s`` old."""
        return self.run(self.producer.layouts(fresh))

    def resize(self, count: int, at: datetime) -> Layout:
        """Change the shard count from the bucket starting at ``at`` on.

        Raises ``ResizeRefused`` naming the earliest allowed cutover when ``at`` is too
        early, not on a bucket boundary, or not after the latest layout.
        """
        return self.run(self.producer.resize(count, at))

    def build(self, spec: JobSpec, now_ms: int | None = None) -> Job:
        """Validate ``spec`` and place it (bucket, shard, fire time); writes nothing."""
        return self.run(self.producer.build(spec, now_ms))

    def schedule(self, job_id: str, due_at: datetime, kind: str, payload: Any = None, *,
                 jitter_s: float = 0.0, priority: int = DEFAULT_PRIORITY,
                 key: str | None = None) -> Job:
        """Schedule a job; idempotent by ``job_id``.

        Same id and same due time as a stored job: nothing changes and the stored job
        is returned (kind, payload, priority and key of the first call stay). Different
        due time: a reschedule with this call's kind, payload, priority and key, so the
        job fires once, at the new time. Returns the stored job.

        ``priority``: 0-9, 9 starts first when more jobs are due than can start.
        ``key``: a customer, an account (1-256 bytes of UTF-8, no control characters):
        the job is placed in its key's shard, so one poller sees every job of a key.
        A bad value raises ``InvalidInput`` and nothing is written.
        """
        spec = JobSpec(job_id, due_at, kind, payload, jitter_s, priority, key)
        with producer_span("scheduler.schedule", job_id, kind) as traceparent:
            return self.run(self.producer.schedule_many([spec], traceparent=traceparent))[0]

    def schedule_many(self, specs: Iterable[JobSpec | dict[str, Any]],
                      progress: Callable[[int], None] | None = None) -> list[Job]:
        """Schedule many jobs with many writes in flight; returns the stored jobs in order.

        The whole input is validated first: one bad spec raises ``InvalidInput`` naming
        its position and nothing is written. A spec (or dict) may carry ``priority`` and
        ``key`` as ``schedule`` takes them. A store error part-way leaves earlier
        chunks written; re-running the same call is safe.
        """
        with producer_span("scheduler.schedule_many") as traceparent:
            return self.run(self.producer.schedule_many(specs, progress, traceparent))

    def reschedule(self, job_id: str, due_at: datetime, *, jitter_s: float = 0.0) -> Job:
        """Move a job to a new due time; it fires once, at the new time.

        A fired, cancelled or dead job is re-armed. Raises ``JobNotFound``.
        """
        with producer_span("scheduler.reschedule", job_id) as traceparent:
            return self.run(self.producer.reschedule(job_id, due_at, jitter_s, traceparent))

    def cancel(self, job_id: str) -> bool:
        """Cancel a pending job; True when this call cancelled it.

        A job a poller has already read for firing (it is due within the prefetch
        window, 2 s by default) may still fire once.
        """
        with producer_span("scheduler.cancel", job_id):
            return self.run(self.producer.cancel(job_id))

    def get(self, job_id: str) -> Job:
        """The stored job with its status and history; raises ``JobNotFound``."""
        return self.run(self.producer.get(job_id))

    def describe(self, job_id: str) -> JobView:
        """The job with its payload and where it came from (a re-fire, a schedule, the
        replays of its dead letter): what ``scheduler get`` shows. Raises ``JobNotFound``."""
        return self.run(describe(self.producer, job_id))

    def dead_letters(self) -> list[DeadLetter]:
        """Jobs whose retries ran out or whose kind had no handler."""
        return sorted(self.store.dead_letters(), key=lambda d: d.died_ms)

    def dead_letter_page(self, after: str | None = None, limit: int = 100) -> list[DeadLetter]:
        """At most ``limit`` dead letters after the job id ``after`` (a stable order: pass
        the last id of a page to get the next)."""
        return self.store.dead_letter_page(after, limit)

    def replay_dead(self, job_ids: Sequence[str] | None = None, at: datetime | None = None) -> list[Job]:
        """Re-arm dead jobs (all when ``job_ids`` is None) at ``at`` (default: now), with
        their attempts reset, and remove them from the dead letters. Occurrences of
        recurring schedules are not replayed (their schedule goes on): "all" passes
        over them, and naming one raises ``InvalidInput``."""
        return self.run(replay_dead(self.producer, job_ids, at))

    @property
    def recurring(self) -> Recurring:
        """Recurring schedules: create, update, pause, resume, delete, get, list."""
        return Recurring(self.producer, self.run)

    def close(self) -> None:
        self._close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
