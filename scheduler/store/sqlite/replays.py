"""The embedded store's moves and replays of dead letters (a mixin of ``SqliteStore``,
which provides ``_tx``, ``_all`` and ``retention``)."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from ...domain.keys import job_hash
from ...domain.model import Job
from .. import queries
from ..base import DEAD_LETTER_PARTS, DeadLetter
from ..history import Replay, replay_expiry_ms
from ..rows import bucket_key, done_bucket_params, job_params


def _q(name: str) -> str:
    return queries.named("sqlite/queries.sql")[name]


class SqliteReplays:
    _tx: Any
    _all: Any
    retention: Any

    def _move_in(self, db: sqlite3.Connection, old: Job, new: Job) -> None:
        """``move`` inside the caller's transaction. As in Cassandra: the old row is
        retired (marked done), not deleted."""
        now = time.time_ns() // 1_000_000
        if bucket_key(old) != bucket_key(new):
            db.execute(_q("insert_bucket_row_full"),
                       (*done_bucket_params(old, now), self.retention.after_event_ms(now)))
        expiry = self.retention.after_fire_ms(new.fire_ms)
        db.execute(_q("insert_bucket_row_full"), (*done_bucket_params(new, None), expiry))
        db.execute(_q("insert_job"), (*job_params(new), expiry))

    def replay_dead_letter(self, old: Job, new: Job, letter: DeadLetter, now_ms: int) -> None:
        expires = replay_expiry_ms(self.retention, new, time.time_ns() // 1_000_000)
        with self._tx() as db:
            # First: on a store older than v005 this fails, and nothing is written.
            db.execute(_q("insert_replay"), (new.job_id, now_ms, letter.died_ms, letter.attempts,
                                             letter.error, expires))
            self._move_in(db, old, new)
            db.execute(_q("delete_dead_letter"), (job_hash(old.job_id) % DEAD_LETTER_PARTS, old.job_id))

    def replays(self, job_id: str) -> list[Replay]:
        return [Replay(job_id, int(r), int(d), int(a), e)
                for r, d, a, e in self._all(_q("select_replays"), (job_id,))]
