"""The poller: drains its shards from their checkpoints and fires every due job.

Threads and their jobs:

- the *poll* loop (``run``): every poll interval, for each owned shard, reads the bucket
  after its checkpoint from its cursor up to ``now + prefetch``, oldest bucket first, and
  puts the rows in the release queue; then saves each shard's checkpoint (a fenced LWT,
  only when it moved);
- the *releaser*: sleeps until the oldest queued job is due by the wall clock, then hands
  it to a worker, within the release-rate bounds and the concurrency limit;
- *workers* (``concurrency`` threads): run the handler;
- the *recorder*: writes outcomes (fired, retry, dead) in batches, then marks the rows
  complete so the checkpoint can pass them.

State machine of a shard: claimed (checkpoint read, epoch written) -> draining ->
released (planned: in-flight rows finished and checkpointed) or lost (a fenced write was
refused: its queued rows are dropped, nothing more is checkpointed or released for it).

Guarantees: a job is never handed to a handler before its fire time by the poller's
clock (and fire time >= due time). A row becomes complete only after its outcome is
recorded, and the checkpoint never passes an incomplete row, so a crash re-fires at most
the rows that were read and not yet recorded (the in-flight bound).
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from . import skew
from .clock import Clock, SystemClock
from .dispatch import App, Outcome, run_handler
from .errors import OwnershipLost, SchedulerError
from .faults import Backoff, FaultLog
from .keys import bucket_of_ms, shard_of
from .layout import Layouts
from .metrics import PollerMetrics
from .model import Job
from .pollconfig import PollerConfig, PollerStats, max_prefetch_ms
from .progress import Checkpoint, ShardProgress
from .release import ReleaseQueue
from .store import Store

__all__ = ["Poller", "PollerConfig", "PollerStats", "max_prefetch_ms"]

log = logging.getLogger("scheduler.poller")


@dataclass
class _Shard:
    progress: ShardProgress
    epoch: int
    saved: Checkpoint
    releasing: bool = False  # planned release: read nothing new, finish in-flight rows
    running: int = 0  # rows handed to workers whose outcome is not recorded yet


# Below this many outcomes per write, the recorder waits ``record_linger_s`` first.
LINGER_BELOW = 500
# Due jobs handed to one worker at once, at most (see ``_releaser``), and how long a
# worker runs such a chunk before handing its unstarted jobs back.
MAX_CHUNK = 32
CHUNK_HANDBACK_S = 0.005


class Poller:
    def __init__(self, store: Store, app: App, *, clock: Clock | None = None,
                 config: PollerConfig | None = None, name: str | None = None,
                 metrics: PollerMetrics | None = None) -> None:
        self.store = store
        self.app = app
        self.clock: Clock = clock or SystemClock()
        self.config = config or PollerConfig()
        self.name = name or f"poller-{uuid.uuid4().hex[:8]}"
        self.metrics = metrics or PollerMetrics()
        self.meta = store.meta()
        limit = max_prefetch_ms(self.meta)
        prefetch = self.config.prefetch_s
        self.prefetch_ms = limit if prefetch is None else min(int(prefetch * 1000), limit)
        self.stats = PollerStats()
        # Every store call of every thread reports here: an outage is logged once, then
        # summarised every 30 s, and a fleet releases our shards when it lasts too long.
        self.store_fault = FaultLog(log, "the store", action="store")
        self.metrics.store_failing.set_function(self.store_fault.failing_for)
        self.behind = False
        self._cond = threading.Condition()
        self._shards: dict[int, _Shard] = {}
        self._queue = ReleaseQueue(self.config.max_rate, self.config.max_shard_rate,
                                   monotonic=self.clock.monotonic)
        # Dispatch without a lock per job: the releaser counts what it handed out, each
        # worker counts what it finished in its own slot (the last slot is for inline
        # ``fire`` calls), and in flight is the difference.
        self._work: queue.SimpleQueue[list[Job] | None] = queue.SimpleQueue()
        self._released = 0
        self._finished = [0] * (self.config.concurrency + 1)
        self._want_slot = False
        self._slot_free = threading.Event()
        # Whether recent handlers ran in under CHUNK_HANDBACK_S / MAX_CHUNK each: only
        # then are due jobs handed out in chunks. Written by workers without a lock
        # (a hint; a stale value costs a little speed, never a job).
        self._fast_handlers = True
        self._outcomes: queue.SimpleQueue[list[Outcome]] = queue.SimpleQueue()
        # Due jobs may wait in the work queue beyond the running ones: a worker that
        # finishes takes the next without a thread switch to the releaser. Only due
        # jobs get here, so this costs no precision.
        self._in_flight_cap = self.config.concurrency + self.config.queue_ahead
        self._stopping = threading.Event()
        self._wake = threading.Event()  # set to poll before the interval is up
        self._stopped = threading.Event()
        self._paused_reason: str | None = None
        self._layouts: Layouts | None = None
        self._layouts_at = -1e9
        self._last_clock_check = -1e9
        self._last_checkpoint = -1e9
        self._threads: list[threading.Thread] = []
        self._rand = random.Random()
        # Set by a fleet: False while the coordinator cannot vouch for our ownership.
        self.lease: Callable[[], bool] = lambda: True

    # --- ownership ------------------------------------------------------------------

    @property
    def shards(self) -> set[int]:
        with self._cond:
            return set(self._shards)

    def claim(self, shard: int, epoch: int | None = None) -> None:
        """Start draining ``shard`` under fencing token ``epoch`` (from the coordinator;
        None, without one: the stored epoch + 1). Raises ``OwnershipLost`` when another
        owner holds it with a newer epoch."""
        if epoch is None:
            current = {c.shard: c.owner_epoch for c in self.store.checkpoints()}
            epoch = current.get(shard, 0) + 1
        initial = self.meta.origin_bucket - self.meta.bucket_width_s
        cp = self.store.claim_shard(shard, self.name, epoch, initial, self.clock.now_ms())
        with self._cond:
            self._shards[shard] = _Shard(ShardProgress(shard, self.meta.bucket_width_s, cp), epoch, cp)
            self.metrics.owned_shards.set(len(self._shards))
            self._cond.notify_all()
        self._wake.set()  # read the new shard now, not at the next tick
        log.info("claimed shard %d at bucket %d", shard, cp.drained,
                 extra={"action": "shard_claimed", "shard": shard, "epoch": epoch,
                        "checkpoint": cp.drained, "poller": self.name})

    def release(self, shard: int, timeout_s: float | None = None) -> None:
        """Planned handover: stop reading ``shard``, drop its queued rows, wait for its
        in-flight rows, save the checkpoint and clear the owner."""
        deadline = self.clock.monotonic() + (timeout_s if timeout_s is not None
                                             else self.config.shutdown_timeout_s)
        with self._cond:
            st = self._shards.get(shard)
            if st is None:
                return
            st.releasing = True
            # Queued rows stay incomplete, so the saved checkpoint stops before them and the
            # next owner reads them again.
            self._queue.discard_shard(shard)
            while st.running and self.clock.monotonic() < deadline and not self._stopped.is_set():
                self._cond.wait(0.05)
        self._save_checkpoint(shard, st)
        with self._cond:
            self._shards.pop(shard, None)
            self.metrics.owned_shards.set(len(self._shards))
        self.metrics.forget_shard(shard)
        self._release_in_store(shard, st.epoch)
        log.info("released shard %d", shard, extra={"action": "shard_released", "shard": shard,
                                                     "checkpoint": st.saved.drained})

    def _release_in_store(self, shard: int, epoch: int) -> None:
        """Clear the shard's owner in the store; best effort (the next claim fences anyway)."""
        try:
            if not self.store.release_shard(shard, epoch, self.clock.now_ms()):
                self.metrics.fencing_refusals.inc()
                log.warning("release of shard %d refused: epoch %d no longer owns it", shard, epoch,
                            extra={"action": "fencing_refused", "shard": shard, "epoch": epoch})
        except SchedulerError as exc:
            log.warning("could not clear owner of shard %d: %s", shard, exc,
                        extra={"action": "shard_release_failed", "shard": shard})

    def lose(self, shard: int, reason: str, *, fenced: bool = True) -> None:
        """Ownership moved (``fenced``: a fenced write was refused) or is given up
        without a word to the store (it cannot be reached): drop everything of the
        shard without writing for it again. Its unrecorded rows stay for the next owner."""
        with self._cond:
            st = self._shards.pop(shard, None)
            if st is None:
                return
            self._queue.discard_shard(shard)
            self.metrics.owned_shards.set(len(self._shards))
            self.stats.lost_shards.append(shard)
        self.metrics.forget_shard(shard)
        if fenced:
            self.metrics.fencing_refusals.inc()
        # Given up (not fenced): the caller logs one line for all of them.
        log.log(logging.WARNING if fenced else logging.INFO, "lost shard %d: %s", shard, reason,
                extra={"action": "shard_lost", "shard": shard, "epoch": st.epoch})

    # --- the poll loop --------------------------------------------------------------

    def layouts(self) -> Layouts:
        if self._layouts is None or self.clock.monotonic() - self._layouts_at >= self.config.layout_refresh_s:
            self._layouts = self.store.layouts()
            self._layouts_at = self.clock.monotonic()
        return self._layouts

    def poll_once(self) -> int:
        """Read every owned shard up to the horizon; returns rows queued, or -1 when the
        store failed (the poll stops at the first failure, reported to ``store_fault``,
        and the shards are read again next time). Sets ``behind`` when a shard stopped
        early because the buffer was full (catch-up in progress)."""
        self.behind = False
        with self.metrics.poll_duration.time():
            queued = 0
            try:
                self._check_clock()
                layouts = self.layouts()
                with self._cond:
                    order = sorted(self._shards.items(), key=lambda kv: kv[1].progress.drained)
                for shard, st in order:
                    queued += self._poll_shard(shard, st, layouts)
                self.store_fault.ok()
            except SchedulerError as exc:
                self.store_fault.failed(exc)
                return -1
            finally:
                self._maybe_checkpoint()
            return queued

    def _buffered(self) -> int:
        return sum(s.progress.in_flight for s in self._shards.values())

    def _poll_shard(self, shard: int, st: _Shard, layouts: Layouts) -> int:
        queued = 0
        while not st.releasing and not self._stopping.is_set():
            with self._cond:
                if self._buffered() >= self.config.max_buffered:
                    self.behind = True
                    return queued
                if shard not in self._shards:
                    return queued
            now = self.clock.now_ms()
            nxt = st.progress.next_read(now + self.prefetch_ms)
            if nxt is None:
                return queued
            bucket, after, until = nxt
            if shard >= layouts.read_count(bucket):
                # This bucket's layouts have fewer shards: nothing to read, only to close.
                if not st.progress.on_read(bucket, [], full=False, issued_at_ms=now):
                    return queued
                continue
            rows = self.store.read_bucket(bucket, shard, after, until, self.config.read_limit)
            self.stats.reads += 1
            self.stats.rows_read += len(rows)
            self.metrics.rows_read.inc(len(rows))
            keys = []
            due = []
            for row in rows:
                keys.append((row.fire_ms, row.job_id))
                # A row fired by an earlier owner (recorded before it stopped), or left by a
                # fire record that raced a cancel, needs nothing more.
                if row.fired_ms is None and row.kind:
                    due.append(row)
            with self._cond:
                if shard not in self._shards:
                    return queued
                again = st.progress.on_read(bucket, keys, full=len(rows) >= self.config.read_limit,
                                            issued_at_ms=now)
                if len(due) < len(rows):
                    for row in rows:
                        if row.fired_ms is not None or not row.kind:
                            st.progress.complete(bucket, (row.fire_ms, row.job_id))
                push = self._queue.push
                for row in due:
                    push(row)
                queued += len(due)
                if due:
                    self._cond.notify_all()
            if not again:
                return queued
        return queued

    def _maybe_checkpoint(self, force: bool = False) -> None:
        now = self.clock.monotonic()
        if not force and now - self._last_checkpoint < self.config.checkpoint_interval_s:
            return
        self._last_checkpoint = now
        with self._cond:
            shards = list(self._shards.items())
        now_ms = self.clock.now_ms()
        for shard, st in shards:
            self._save_checkpoint(shard, st)
            lag = now_ms / 1000 - (st.saved.drained + self.meta.bucket_width_s)
            self.metrics.checkpoint_lag.labels(str(shard)).set(max(0.0, lag))

    def _save_checkpoint(self, shard: int, st: _Shard) -> None:
        with self._cond:
            cp = st.progress.checkpoint()
        if cp == st.saved:
            return
        try:
            self.store.save_checkpoint(shard, st.epoch, cp, self.clock.now_ms())
            st.saved = cp
        except OwnershipLost as exc:
            self.lose(shard, str(exc))
        except SchedulerError as exc:
            self.store_fault.failed(exc)

    def _check_clock(self) -> None:
        if not self.config.check_clock:
            return
        mono = self.clock.monotonic()
        if mono - self._last_clock_check < self.config.clock_check_interval_s:
            return
        self._last_clock_check = mono
        reading = skew.measure(self.clock, self.store)
        skew_ms = reading.skew_ms
        self.metrics.clock_skew.set(skew_ms / 1000)
        with self._cond:
            if reading.exceeds(self.meta.max_skew_ms):
                if self._paused_reason is None:
                    log.error("clock skew %d ms against the store exceeds %d ms: refusing to fire",
                              skew_ms, self.meta.max_skew_ms,
                              extra={"action": "clock_skew_refused", "skew_ms": skew_ms})
                self._paused_reason = f"clock skew {skew_ms} ms"
                self.metrics.clock_refusing.set(1)
            elif self._paused_reason is not None:
                log.info("clock skew back to %d ms: firing again", skew_ms,
                         extra={"action": "clock_skew_ok", "skew_ms": skew_ms})
                self._paused_reason = None
                self.metrics.clock_refusing.set(0)
                self._cond.notify_all()

    @property
    def refusing(self) -> str | None:
        """Why firing is paused, or None."""
        return self._paused_reason

    # --- releasing and firing -------------------------------------------------------

    def in_flight(self) -> int:
        """Jobs handed to workers whose handler has not returned yet."""
        return self._released - sum(self._finished)

    def release_ready(self) -> list[Job]:
        """Take the jobs that may fire now (due, within rate and concurrency bounds)."""
        if not self.lease():
            return []
        with self._cond:
            free = self._in_flight_cap - self.in_flight()
            if self._paused_reason is not None or self._stopping.is_set() or free <= 0:
                return []
            jobs = self._queue.pop_ready(self.clock.now_ms(), free)
            self._released += len(jobs)
            for job in jobs:
                st = self._shards.get(job.shard)
                if st is not None:
                    st.running += 1
            if self._queue.throttled:
                self.metrics.throttled.inc(self._queue.throttled)
                self._queue.throttled = 0
            return jobs

    def fire(self, job: Job, slot: int = -1) -> Outcome:
        """Run the handler of one job and queue its outcome for recording."""
        return self._fire_chunk([job], slot)[0]

    def _fire_chunk(self, jobs: list[Job], slot: int) -> list[Outcome]:
        """Run the handlers of ``jobs`` in order and queue their outcomes together. A
        chunk running longer than ``CHUNK_HANDBACK_S`` hands its unstarted jobs back to
        the work queue for an idle worker, so a slow handler holds up at most itself."""
        outcomes: list[Outcome] = []
        app, now_ms, rand, finished = self.app, self.clock.now_ms, self._rand.random, self._finished
        started = time.monotonic()
        try:
            for i, job in enumerate(jobs):
                if i and time.monotonic() - started > CHUNK_HANDBACK_S:
                    self._work.put(jobs[i:])
                    self._fast_handlers = False
                    break
                try:
                    outcomes.append(run_handler(app, job, now_ms, rand))
                finally:
                    finished[slot] += 1  # only this thread writes this slot
        finally:
            if outcomes:
                self._outcomes.put(outcomes)
                if len(outcomes) == len(jobs):
                    per_job = (time.monotonic() - started) / len(jobs)
                    self._fast_handlers = per_job < CHUNK_HANDBACK_S / MAX_CHUNK
            if self._want_slot and self.in_flight() <= self._in_flight_cap // 2:
                self._slot_free.set()
        return outcomes

    def _worker(self, slot: int) -> None:
        while (jobs := self._work.get()) is not None:
            if self.lease():
                self._fire_chunk(jobs, slot)
                continue
            # Ownership is in doubt (a freeze, a suspended connection): do not fire. The
            # jobs go back to the queue; they are released again once the lease is renewed,
            # or dropped with their shard if ownership is lost (their rows stay unrecorded
            # for the next owner). The cursor has passed them: they must not be forgotten.
            with self._cond:
                for job in jobs:
                    st = self._shards.get(job.shard)
                    if st is not None:
                        st.running -= 1
                        self._queue.push(job)
                    self._finished[slot] += 1

    def _releaser(self) -> None:
        while not self._stopping.is_set():
            jobs = self.release_ready()
            if jobs:
                # Due jobs beyond one per worker go out in chunks: one hand-off (a queue
                # operation and a thread wake-up) per chunk instead of per job. Only when
                # more are due than there are workers, so no job waits that one could run.
                # Only while handlers are fast: slow ones are better spread one by one.
                size = (min(MAX_CHUNK, max(1, len(jobs) // self.config.concurrency))
                        if self._fast_handlers else 1)
                for i in range(0, len(jobs), size):
                    self._work.put(jobs[i:i + size])
                continue
            # Set the flag before looking, so a worker finishing meanwhile wakes us.
            self._slot_free.clear()
            self._want_slot = True
            if self.in_flight() > self._in_flight_cap // 2:
                self._slot_free.wait(0.05)
                self._want_slot = False
                continue
            self._want_slot = False
            with self._cond:
                wait = self._queue.next_wake_s(self.clock.now_ms())
                self._cond.wait(min(wait, self.config.poll_interval_s))

    # --- recording outcomes ---------------------------------------------------------

    def record_outcomes(self, block_s: float = 0.0) -> int:
        """Write queued outcomes, then mark their rows complete. Returns how many.

        On a store error the outcomes are put back and retried on the next call: their
        rows stay incomplete, so the checkpoint waits for them.
        """
        batch: list[Outcome] = []
        try:
            batch.extend(self._outcomes.get(timeout=block_s) if block_s else self._outcomes.get_nowait())
            while len(batch) < 2000:
                batch.extend(self._outcomes.get_nowait())
        except queue.Empty:
            pass
        if not batch:
            return 0
        now = self.clock.now_ms()
        # One pass sorts the batch; with a fast handler this runs once per job fired.
        fired: list[Job] = []
        failed: list[Outcome] = []
        lateness: list[float] = []
        for o in batch:
            lateness.append(max(0, o.started_ms - o.job.due_ms) / 1000)
            if o.ok:
                fired.append(o.job)
            else:
                failed.append(o)
        try:
            if fired:
                self.store.record_fired(fired, now)
            for o in failed:
                if o.dead:
                    self.store.record_dead(o.job, o.error or "", now)
                elif o.retry_at_ms is not None:
                    self.store.record_retry(o.job, self._retry_job(o.job, o.retry_at_ms), o.error or "",
                                            now)
        except SchedulerError as exc:
            # Rows stay incomplete, so the checkpoint waits for them; the recorder backs off.
            self.store_fault.failed(f"recording {len(batch)} outcomes (kept, retried): {exc}")
            self._outcomes.put(batch)
            return -1
        self.store_fault.ok()
        with self._cond:
            shards = self._shards
            for o in batch:
                job = o.job
                st = shards.get(job.shard)
                if st is not None:
                    st.running -= 1
                    st.progress.complete(job.bucket, (job.fire_ms, job.job_id))
            self._cond.notify_all()
        self.metrics.lateness.observe_many(lateness)
        kinds = {job.kind for job in fired}
        if len(kinds) == 1:
            self.metrics.fired.labels(kinds.pop()).inc(len(fired))
        elif kinds:
            for kind, n in Counter(job.kind for job in fired).items():
                self.metrics.fired.labels(kind).inc(n)
        self.stats.fired += len(fired)
        for o in failed:
            self.metrics.handler_errors.labels(o.job.kind).inc()
            if o.dead:
                self.stats.dead += 1
                self.metrics.dead.labels(o.job.kind).inc()
                log.warning("dead-lettered %s: %s", o.job.job_id, o.error,
                            extra={"action": "job_dead", "job_id": o.job.job_id, "kind": o.job.kind})
            else:
                self.stats.retried += 1
                self.metrics.retries.labels(o.job.kind).inc()
        return len(batch)

    def _retry_job(self, job: Job, retry_at_ms: int) -> Job:
        """The retry's placement: the late-write rule and its bucket's layout apply."""
        fire = max(retry_at_ms, self.clock.now_ms() + self.meta.late_margin_ms)
        bucket = bucket_of_ms(fire, self.meta.bucket_width_s)
        count = self.layouts().write_layout(bucket).shard_count
        return job.evolve(fire_ms=fire, bucket=bucket, shard=shard_of(job.job_id, count),
                          attempts=job.attempts + 1)

    def _recorder(self) -> None:
        linger = self.config.record_linger_s
        # Short: after an outage, outcomes of jobs fired meanwhile must reach the store
        # before a new owner of their shard re-reads them (see Fleet.REJOIN_SETTLE_S).
        backoff = Backoff(first=0.1, cap=0.5)
        while not self._stopped.is_set():
            n = self.record_outcomes(block_s=0.05)
            if n < 0:
                self._stopped.wait(backoff.next())
                continue
            backoff.reset()
            # With slow handlers outcomes trickle in one at a time, and writing each on
            # its own costs a round trip and a Cassandra mutation per job (measured: ~10x
            # the CPU per job of a no-op handler). Letting them gather for a few ms turns
            # those into single-partition batches; it delays only the bookkeeping, never
            # a firing, and widens the crash-duplicate window by at most ``linger``.
            if 0 < n < LINGER_BELOW:
                self._linger(linger)

    def _linger(self, seconds: float) -> None:
        """Wait up to ``seconds`` for more outcomes; end early when enough are waiting
        or no job is running any more (nothing else is coming: the last outcomes of a
        drain are written at once, not ``seconds`` later)."""
        # Real time, like the waits themselves (a test's manual clock may stand still).
        deadline = time.monotonic() + seconds
        while (time.monotonic() < deadline and self.in_flight() > 0
               and self._outcomes.qsize() < LINGER_BELOW):
            if self._stopped.wait(0.005):
                return

    # --- lifecycle ------------------------------------------------------------------

    def start(self, shards: Iterable[int] = (), epoch: int | None = None) -> None:
        """Claim ``shards`` and start the background threads (the poll loop included)."""
        for shard in shards:
            self.claim(shard, epoch)
        for slot in range(self.config.concurrency):
            t = threading.Thread(target=self._worker, args=(slot,), name=f"{self.name}-w{slot}", daemon=True)
            t.start()
            self._threads.append(t)
        for target, label in ((self._releaser, "release"), (self._recorder, "record"),
                              (self._poll_loop, "poll")):
            t = threading.Thread(target=target, name=f"{self.name}-{label}", daemon=True)
            t.start()
            self._threads.append(t)

    def _poll_loop(self) -> None:
        backoff = Backoff(first=0.25, cap=2.0)
        while not self._stopping.is_set():
            started = self.clock.monotonic()
            if self.poll_once() < 0:
                # The store failed: try again soon (the driver reconnects within 2 s of
                # its return), but not at every bucket boundary or thread wake-up.
                self._wake.wait(backoff.next())
                self._wake.clear()
                continue
            backoff.reset()
            with self._cond:
                self.metrics.buffered.set(self._buffered())
            if self.behind:
                # Catching up: read again as soon as half the buffer has drained.
                with self._cond:
                    while (self._buffered() > self.config.max_buffered // 2
                           and not self._stopping.is_set()):
                        self._cond.wait(0.05)
                continue
            remaining = self.config.poll_interval_s - (self.clock.monotonic() - started)
            # Only a read issued after a bucket ended closes it, and the next bucket is
            # read only then: poll right at each boundary too, or the first jobs of every
            # bucket wait up to a poll interval (measured before this: p99 296 ms, max
            # 1.3 s at 8,333 jobs/s over a window crossing two boundaries).
            width_ms = self.meta.bucket_width_s * 1000
            to_boundary = (width_ms - self.clock.now_ms() % width_ms) / 1000 + 0.001
            self._wake.wait(max(0.0, min(remaining, to_boundary)))
            self._wake.clear()

    def stop(self, timeout_s: float | None = None) -> None:
        """Graceful shutdown: stop reading and releasing, let in-flight handlers finish
        (up to the timeout), record their outcomes, save checkpoints, release shards."""
        timeout = self.config.shutdown_timeout_s if timeout_s is None else timeout_s
        self._stopping.set()
        self._wake.set()
        with self._cond:
            self._queue.drain()  # unfired rows stay in the store, after the checkpoint
            self._cond.notify_all()
        deadline = self.clock.monotonic() + timeout
        while self.in_flight() > 0 and self.clock.monotonic() < deadline:
            self._stopping.wait(0.02)
        # Jobs handed out but not yet started go back: they stay unfired in the store.
        try:
            while (chunk := self._work.get_nowait()) is not None:
                self._finished[-1] += len(chunk)
        except queue.Empty:
            pass
        for _ in range(self.config.concurrency):
            self._work.put(None)
        while self.record_outcomes() > 0:  # -1: the store failed; the rows stay unrecorded
            pass
        self._stopped.set()
        for t in self._threads:
            t.join(timeout=2)
        for shard in sorted(self.shards):
            with self._cond:
                st = self._shards.get(shard)
            if st is None:
                continue
            self._save_checkpoint(shard, st)
            if shard in self.shards:
                self._release_in_store(shard, st.epoch)
        log.info("poller stopped", extra={"action": "poller_stopped", "poller": self.name,
                                          "fired": self.stats.fired})
