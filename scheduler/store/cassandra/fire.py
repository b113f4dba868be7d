"""The Cassandra store's poller-side writes: firings, retries, dead letters (a mixin of
``CassandraStore``, which provides ``prepared``, ``_batch``, ``_concurrent``,
``run``, ``job_ttl`` and ``retention``). Every write carries the TTL of its row (see
``cql/versions/v003_retention.cql``)."""

from __future__ import annotations

import itertools
import os
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

from ...domain.keys import job_hash
from ...domain.model import Job, Status
from ...domain.retention import ttl_s
from ..base import DEAD_LETTER_PARTS, DeadLetter
from ..rows import bucket_key
from .bind import done_bucket_params, job_params
from .conf import dt_ms, translate
from .run import CqlSteps, Many, Run, dual

# Bucket-row batches stay under Cassandra's default 5 KiB batch warning threshold.
BATCH_ROWS = 50
# Jobs listed in one row of fired_batches: about 20 KB with 30-byte ids, one cell each
# for the two lists.
FIRED_BATCH_ROWS = 500
# The most fire time one row of fired_batches spans (its first to its last key): a read
# for the keys up to a time T needs only the rows that end by T plus this.
FIRED_BATCH_SPAN_MS = 10_000


class _Ids:
    """Batch ids: this process's random 64 bits, then a counter. Unique without a random
    draw per row (uuid4 reads the OS's random source each time: 2 % of a draining poller's
    CPU); a forked child draws its own prefix (it must not repeat its parent's ids)."""

    def __init__(self) -> None:
        self.reseed()
        os.register_at_fork(after_in_child=self.reseed)

    def reseed(self) -> None:
        self.prefix, self.count = uuid.uuid4().int >> 64 << 64, itertools.count()

    def next(self) -> uuid.UUID:
        return uuid.UUID(int=self.prefix | next(self.count))


_IDS = _Ids()


def host_ms() -> int:
    """This host's clock: Cassandra counts a TTL from its own clock, not a caller's."""
    return int(time.time() * 1000)


def batch_id() -> uuid.UUID:
    """A new id for a row of ``fired_batches``: two rows never share one, so a batch never
    overwrites another that ends at the same key (two owners firing the same row)."""
    return _IDS.next()


def _spans(keys: list[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    """Sorted ``keys`` cut into rows of ``fired_batches``: at most ``FIRED_BATCH_ROWS``
    keys, spanning at most ``FIRED_BATCH_SPAN_MS`` of fire time each."""
    out: list[list[tuple[int, str]]] = []
    for key in keys:
        if not out or len(out[-1]) >= FIRED_BATCH_ROWS or key[0] - out[-1][0][0] > FIRED_BATCH_SPAN_MS:
            out.append([])
        out[-1].append(key)
    return out


class CassandraFiring:
    prepared: Any
    _batch: Any
    _concurrent: Any
    run: Any
    session: Any
    job_ttl: Any
    retention: Any

    def record_fired(self, jobs: Sequence[Job], fired_ms: int) -> None:
        """Rows of ``fired_batches`` listing the jobs (``cql/versions/v011_fired_batches.cql``):
        per partition, at most ``FIRED_BATCH_ROWS`` jobs within ``FIRED_BATCH_SPAN_MS`` of
        fire time a row. One mutation for many jobs, and no cell added to the bucket rows
        that every later read would merge. All rows are sent concurrently; each is
        idempotent (its batch id is fixed before sending)."""
        stmt = self.prepared("insert_fired_batch")
        by_partition: dict[tuple[int, int], list[tuple[int, str]]] = defaultdict(list)
        for job in jobs:
            by_partition[(job.bucket, job.shard)].append((job.fire_ms, job.job_id))
        now, keep_ms = host_ms(), self.retention.jobs_s * 1000
        writes: list[tuple[Any, Any]] = []
        for (bucket, shard), keys in by_partition.items():
            keys.sort()
            for part in _spans(keys):
                (first_fire, first_id), (last_fire, last_id) = part[0], part[-1]
                writes.append((stmt, (bucket, shard, last_fire, last_id, batch_id(), first_fire, first_id,
                                      fired_ms, [f for f, _ in part], [j for _, j in part],
                                      ttl_s(last_fire + keep_ms, now))))
        self._concurrent(writes, f"recording {len(jobs)} fired jobs")

    def record_retry(self, old: Job, new: Job, error: str, now_ms: int) -> None:
        # The lookup row is rewritten whole: a cell left out would keep the old TTL.
        ttl = self.job_ttl(new)
        self._batch(f"scheduling a retry of {new.job_id!r}", [
            ("mark_fired", (self.job_ttl(old), now_ms, *bucket_key(old))),
            # fired_at written null (one cell tombstone a retry): the job may have sat at
            # this position before (moved away, or placed later and back), and a retired
            # row's fired_at left there would make the retry read as fired.
            ("insert_bucket_row_full", (*done_bucket_params(new, None), ttl)),
            ("insert_job", (*job_params(new.evolve(status=Status.PENDING, last_error=error,
                                                   fired_ms=now_ms)), ttl)),
        ])

    def record_dead(self, job: Job, error: str, now_ms: int) -> None:
        ret, host = self.retention, host_ms()
        dead = job.evolve(status=Status.DEAD, attempts=job.attempts + 1, last_error=error, fired_ms=now_ms)
        self._batch(f"dead-lettering {job.job_id!r}", [
            ("mark_fired", (self.job_ttl(job), now_ms, *bucket_key(job))),
            ("insert_job", (*job_params(dead), ttl_s(ret.dead_lookup_ms(host), host))),
            ("insert_dead_letter", (job_hash(job.job_id) % DEAD_LETTER_PARTS, job.job_id, job.kind,
                                    job.due_ms, job.attempts + 1, error, now_ms,
                                    ttl_s(ret.dead_letter_ms(host), host))),
        ])

    def lookup_positions(self, first_bucket: int, last_bucket: int) -> Iterator[tuple[str, int, int, int]]:
        try:
            for job_id, bucket, shard, fire in self.session.execute(self.prepared("select_job_positions")):
                if bucket is not None and first_bucket <= bucket <= last_bucket:
                    yield job_id, int(bucket), int(shard or 0), int(fire or 0)
        except Exception as exc:
            raise translate(exc, "scanning the lookup table") from exc

    @dual
    def dead_letters_in(self, part: int, after: str, limit: int) -> CqlSteps[list[DeadLetter]]:
        rows = yield Run("select_dead_letters_after", (part, after, limit), "reading dead letters")
        return [DeadLetter(j, k, dt_ms(d), int(a), e, dt_ms(t)) for j, k, d, a, e, t in rows]

    @dual
    def dead_letters(self) -> CqlSteps[list[DeadLetter]]:
        stmt = self.prepared("select_dead_letters")
        out: list[DeadLetter] = []
        parts = [(stmt, (p,)) for p in range(DEAD_LETTER_PARTS)]
        for rows in (yield Many(parts, "reading dead letters")):
            out.extend(DeadLetter(j, k, dt_ms(d), int(a), e, dt_ms(t)) for j, k, d, a, e, t in rows)
        return out

    @dual
    def delete_dead_letter(self, job_id: str) -> CqlSteps[None]:
        yield Run("delete_dead_letter", (job_hash(job_id) % DEAD_LETTER_PARTS, job_id),
                 f"removing dead letter {job_id!r}")
