"""The recorder: writes outcomes (fired, retry, dead) in batches, then marks their rows
complete so the checkpoint can pass them, and logs failed attempts once they are recorded
(at most ``FAILURE_LINES`` lines per kind a minute, the rest in one summary line; the
traceback of the first failure of each kind and exception type).

Under failure: a store error puts the batch back and the loop backs off (0.1 s to
0.5 s); the rows stay incomplete, so the checkpoint waits for them. A crash loses only
unrecorded outcomes: their jobs fire again under the next owner (the in-flight bound).
"""

from __future__ import annotations

import logging
import queue
import time
from collections import Counter

from ..domain.dispatch import Outcome
from ..domain.keys import bucket_of_ms, from_ms, shard_key
from ..domain.model import OCCURRENCE_PREFIX, Job
from ..domain.progress import Key
from ..errors import GiveUp, RetryLater, SchedulerError
from ..observe.faults import Backoff
from ..observe.logdigest import LogDigest, summary_text
from ..store.base import PartRange
from ..store.roles import Firing
from .flowqueue import PLACED_BY_FLOW
from .occurrences import WAIT
from .rows import by_partition, span
from .shared import Core

log = logging.getLogger("scheduler.poller")

# Below this many outcomes per write, the recorder waits ``record_linger_s`` first.
LINGER_BELOW = 500
BATCH_MAX = 2000
# Rows read beyond the ones checked before a flow placement (others at the same times).
RETIRED_SLACK = 64
# Failed attempts logged one by one per kind and minute, at most; the error text in a
# line is cut to this many characters (a handler's message can be long, and may quote
# its input: the payload itself is never logged).
FAILURE_LINES = 10
FAILURE_WINDOW_S = 60.0
ERROR_CHARS = 300


class Recorder:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.failures = LogDigest(FAILURE_LINES, FAILURE_WINDOW_S, core.clock.monotonic)

    def record_outcomes(self, block_s: float = 0.0) -> int:
        """Write queued outcomes, then mark their rows complete. Returns how many, or -1
        when the store failed: the outcomes are put back and retried on the next call,
        and their rows stay incomplete, so the checkpoint waits for them."""
        core = self.core
        batch: list[Outcome] = []
        try:
            batch.extend(core.outcomes.get(timeout=block_s) if block_s else core.outcomes.get_nowait())
            while len(batch) < BATCH_MAX:
                batch.extend(core.outcomes.get_nowait())
        except queue.Empty:
            pass
        if not batch:
            # Nothing left to record while stopping: no window outlives the poller.
            self.summarise(force=core.stopping.is_set())
            return 0
        now = core.clock.now_ms()
        # One pass sorts the batch; with a fast handler this runs once per job fired.
        fired: list[Job] = []
        failed: list[Outcome] = []
        skipped: list[Outcome] = []
        lateness: list[float] = []
        for o in batch:
            if o.ok:
                fired.append(o.job)
            elif o.skip is not None:
                skipped.append(o)
                continue
            else:
                failed.append(o)
            lateness.append(max(0, o.started_ms - o.job.due_ms) / 1000)
        store: Firing = core.store
        placed: list[Job] = []  # jobs flow control placed later, at their new rows
        try:
            # A failed attempt is checked too: its retry, written for a job its producer
            # cancelled or moved while the handler ran, would bring the job back; its
            # dead letter would mark a cancelled job dead (and replayable), or a moved
            # one dead while its new row still fires.
            retired = self._retired([o.job for o in skipped if o.skip == WAIT and o.error in PLACED_BY_FLOW]
                                    + [o.job for o in failed if o.dead or o.retry_at_ms is not None])
            if fired:
                store.record_fired(fired, now)
            for o in failed:
                if (o.job.fire_ms, o.job.job_id) in retired:
                    continue  # cancelled or moved while its handler ran: nothing to write
                if o.dead:
                    store.record_dead(o.job, o.error or "", now)
                elif o.retry_at_ms is not None:
                    store.record_retry(o.job, self.retry_job(o.job, o.retry_at_ms), o.error or "", now)
            for o in skipped:
                if o.skip == WAIT and (o.job.fire_ms, o.job.job_id) in retired:
                    continue  # cancelled or moved by its producer while it waited: not placed
                if o.skip == WAIT and o.retry_at_ms is not None:
                    later = self.retry_job(o.job, o.retry_at_ms, attempt=False)
                    store.record_retry(o.job, later, o.error or "", now)
                    if o.error in PLACED_BY_FLOW:
                        placed.append(later)
                else:
                    store.record_skipped(o.job, o.error or "", now)
                    if (sid := o.job.schedule_id) is not None:
                        store.add_skipped(sid, 1)
        except SchedulerError as exc:
            core.store_fault.failed(f"recording {len(batch)} outcomes (kept, retried): {exc}")
            core.outcomes.put(batch)
            return -1
        core.store_fault.ok()
        with core.cond:
            shards = core.shards
            due = core.due
            if placed:
                due.placed(placed)
            due.finished_many(o.job for o in batch)
            for o in batch:
                job = o.job
                st = shards.get(job.shard)
                if st is not None:
                    st.running -= 1
                    st.progress.complete(job.bucket, (job.fire_ms, job.job_id))
            core.cond.notify_all()
        self._count(fired, failed, lateness)
        for o in skipped:
            if o.skip != WAIT:
                core.metrics.recurring_skipped.labels(o.skip).inc()
        return len(batch)

    def _retired(self, jobs: list[Job]) -> set[Key]:
        """Of the rows about to be placed later (by flow control, or as a failed attempt's
        retry) or dead-lettered, those the store shows retired (``fired_at`` set: a
        producer cancelled or moved the job since the row was read). Placing one would
        write the job back as pending: a cancel undone, or a rescheduled job fired at its
        old time. One ranged read per shard and bucket, at the store's consistency, so a
        cancel acknowledged before it is seen; only one landing between this read and the
        placement's write still loses (as a cancel racing a fire).
        Raises ``SchedulerError`` when the store fails (the batch is kept and retried)."""
        if not jobs:
            return set()
        groups = by_partition(jobs)
        limit = max(map(len, groups.values())) + RETIRED_SLACK
        out: set[Key] = set()
        # Page on while a span's page is full and some of its rows were not seen yet: a
        # span also holds other kinds' rows, and a row not checked must not be written
        # back as pending.
        ranges = {(shard, bucket): span(shard, bucket, keys) for (shard, bucket), keys in groups.items()}
        while ranges:
            found = self.core.store.read_buckets(list(ranges.values()), limit)
            more: dict[tuple[int, int], PartRange] = {}
            for (part, (bucket, shard, _after, until)), rows in zip(ranges.items(), found, strict=True):
                keys = groups[part]
                for row in rows:
                    key = (row.fire_ms, row.job_id)
                    if key in keys:
                        del keys[key]
                        if row.fired_ms is not None:
                            out.add(key)
                if len(rows) >= limit and keys:
                    last = rows[-1]
                    cursor = (last.fire_ms, last.job_id)
                    # Only while the page moves the cursor on: rows out of order (written
                    # by hand) must not page forever. The rows left unchecked are placed,
                    # as before this check existed: a job is never dropped for it.
                    if _after is None or cursor > _after:
                        more[part] = (bucket, shard, cursor, until)
            ranges = more
        if out:
            self.core.stats.retired_dropped += len(out)
            self.core.metrics.retired_dropped.inc(len(out))
        return out

    def _count(self, fired: list[Job], failed: list[Outcome], lateness: list[float]) -> None:
        core = self.core
        metrics, stats = core.metrics, core.stats
        metrics.lateness.observe_many(lateness)
        if recurring := sum(1 for job in fired if job.job_id.startswith(OCCURRENCE_PREFIX)):
            metrics.recurring_fired.inc(recurring)
        kinds = {job.kind for job in fired}
        if len(kinds) == 1:
            metrics.fired.labels(kinds.pop()).inc(len(fired))
        elif kinds:
            for kind, n in Counter(job.kind for job in fired).items():
                metrics.fired.labels(kind).inc(n)
        stats.fired += len(fired)
        for o in failed:
            metrics.handler_errors.labels(o.job.kind).inc()
            if o.dead:
                stats.dead += 1
                metrics.dead.labels(o.job.kind).inc()
            else:
                stats.retried += 1
                metrics.retries.labels(o.job.kind).inc()
            self.log_failure(o)
        self.summarise()

    def log_failure(self, o: Outcome) -> None:
        """One WARNING line for a recorded failed attempt, unless its kind is over the
        limit (then it is counted for the summary); the traceback too when it is the first
        failure of its kind and exception type."""
        job, error_type = o.job, o.error_type
        admit = self.failures.admit(job.kind, error_type)
        if not admit.log:
            return
        error = o.error or error_type
        if len(error) > ERROR_CHARS:
            error = error[:ERROR_CHARS] + "..."
        then = "dead-lettered" if o.dead else (
            f"retry at {from_ms(o.retry_at_ms).isoformat()}" if o.retry_at_ms is not None else "retried")
        exc = o.exc
        kind = job.kind if len(job.kind) <= 80 else job.kind[:80] + "..."  # a poison row's
        # A GiveUp or RetryLater says all in its message (an HTTP target's status): no traceback.
        trace = admit.first and exc is not None and not isinstance(exc, GiveUp | RetryLater)
        log.warning("job %s (%s) attempt %d failed: %s; %s", job.job_id, kind, job.attempt, error, then,
                    exc_info=(type(exc), exc, exc.__traceback__) if trace and exc is not None else None,
                    extra={"action": "job_dead" if o.dead else "job_attempt_failed", "job_id": job.job_id,
                           "kind": kind, "attempt": job.attempt, "error_type": error_type})

    def summarise(self, force: bool = False) -> None:
        """Log the summaries of the failure windows that are over (``force``: all)."""
        for s in self.failures.due(force):
            log.warning(summary_text(s), extra={"action": "job_failures_summarised", "kind": s.key,
                                                "held": s.held, "by_type": s.by_category})

    def retry_job(self, job: Job, retry_at_ms: int, attempt: bool = True) -> Job:
        """The retry's placement: the late-write rule and its bucket's layout apply, and
        it is never at a position the shard's progress still holds (moved a millisecond
        on until it is not).
        ``attempt``: count a failed attempt (not for an occurrence that waits). The retry
        keeps the job's priority and key, so a keyed job stays in its key's shard."""
        core = self.core
        width = core.meta.bucket_width_s
        fire = max(retry_at_ms, core.clock.now_ms() + core.meta.late_margin_ms)
        while True:
            bucket = bucket_of_ms(fire, width)
            shard = shard_key(job.job_id, job.key, core.layouts().write_layout(bucket).shard_count)
            # Never at a position of this job the shard's progress still holds (its own
            # row, or one taken early before): the write would leave a pending row where
            # the progress counts that position complete, and the job would never fire.
            # A row ahead of its time runs only when taken early (recalled), and flow
            # control, placing a steady backlog at a steady rate, computes the same
            # millisecond again and again.
            if fire == job.fire_ms or self._held(shard, (fire, job.job_id)):
                fire += 1
                continue
            return job.evolve(fire_ms=fire, bucket=bucket, shard=shard,
                              attempts=job.attempts + (1 if attempt else 0))

    def _held(self, shard: int, key: Key) -> bool:
        core = self.core
        with core.cond:
            st = core.shards.get(shard)
            return st is not None and st.progress.holds(key)

    def run(self) -> None:
        """The recorder thread's body, until the poller has stopped."""
        core = self.core
        linger = core.config.record_linger_s
        # Short: after an outage, outcomes of jobs fired meanwhile must reach the store
        # before a new owner of their shard re-reads them (see Fleet.REJOIN_SETTLE_S).
        backoff = Backoff(first=0.1, cap=0.5)
        while not core.stopped.is_set():
            n = self.record_outcomes(block_s=0.05)
            if n < 0:
                core.stopped.wait(backoff.next())
                continue
            backoff.reset()
            # With slow handlers outcomes trickle in one at a time, and writing each on
            # its own costs a round trip and a Cassandra mutation per job (measured: ~10x
            # the CPU per job of a no-op handler). Letting them gather for a few ms turns
            # those into single-partition batches; it delays only the bookkeeping, never
            # a firing, and widens the crash-duplicate window by at most ``linger``.
            if 0 < n < LINGER_BELOW:
                self.linger(linger)

    def linger(self, seconds: float) -> None:
        """Wait up to ``seconds`` for more outcomes; end early when enough are waiting
        or no job is running any more (nothing else is coming: the last outcomes of a
        drain are written at once, not ``seconds`` later)."""
        core = self.core
        # Real time, like the waits themselves (a test's manual clock may stand still).
        deadline = time.monotonic() + seconds
        while (time.monotonic() < deadline and core.flight.in_flight() > 0
               and core.outcomes.qsize() < LINGER_BELOW):
            if core.stopped.wait(0.005):
                return
