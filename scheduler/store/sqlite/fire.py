"""The embedded store's poller-side writes: firings, retries and dead letters (a mixin of
``SqliteStore``, which provides ``_tx`` and ``retention``). Each firing sets its row's
``fired_at``: one local write per row costs little here (Cassandra records firings in
batches, ``cql/versions/v011_fired_batches.cql``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ...domain.keys import job_hash
from ...domain.model import Job, Status
from .. import queries
from ..base import DEAD_LETTER_PARTS
from ..rows import bucket_key, bucket_params, job_params


def _q(name: str) -> str:
    return queries.named("sqlite/queries.sql")[name]


def host_ms() -> int:
    """This host's clock, in ms: the retention's expiries are counted from it."""
    return time.time_ns() // 1_000_000


class SqliteFiring:
    _tx: Any
    retention: Any

    def record_fired(self, jobs: Sequence[Job], fired_ms: int) -> None:
        with self._tx() as db:
            db.executemany(_q("mark_fired"), [(fired_ms, *bucket_key(j)) for j in jobs])

    def record_retry(self, old: Job, new: Job, error: str, now_ms: int) -> None:
        expiry = self.retention.after_fire_ms(new.fire_ms)
        retry = new.evolve(status=Status.PENDING, last_error=error, fired_ms=now_ms)
        with self._tx() as db:
            db.execute(_q("mark_fired"), (now_ms, *bucket_key(old)))
            db.execute(_q("insert_bucket_row"), (*bucket_params(new), expiry))
            db.execute(_q("insert_job"), (*job_params(retry), expiry))

    def record_dead(self, job: Job, error: str, now_ms: int) -> None:
        ret, host = self.retention, host_ms()
        dead = job.evolve(status=Status.DEAD, attempts=job.attempts + 1, last_error=error, fired_ms=now_ms)
        with self._tx() as db:
            db.execute(_q("mark_fired"), (now_ms, *bucket_key(job)))
            db.execute(_q("insert_job"), (*job_params(dead), ret.dead_lookup_ms(host)))
            db.execute(_q("insert_dead_letter"), (job_hash(job.job_id) % DEAD_LETTER_PARTS, job.job_id,
                                                  job.kind, job.due_ms, job.attempts + 1, error, now_ms,
                                                  ret.dead_letter_ms(host)))
