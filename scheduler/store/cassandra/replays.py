"""The Cassandra store's replays of dead letters (a mixin of ``CassandraStore``, which
provides ``retention`` and ``_move_rows``, the rows of a ``move``)."""

from __future__ import annotations

from typing import Any

from ...domain.keys import job_hash
from ...domain.model import Job
from ...domain.retention import ttl_s
from ..base import DEAD_LETTER_PARTS, DeadLetter
from ..history import Replay, replay_expiry_ms
from .conf import dt_ms
from .fire import host_ms
from .run import Batch, CqlSteps, Run, dual


class CassandraReplays:
    retention: Any
    _move_rows: Any

    @dual
    def replay_dead_letter(self, old: Job, new: Job, letter: DeadLetter, now_ms: int) -> CqlSteps[None]:
        """One logged batch. On a keyspace older than v005 the replay row's statement
        cannot be prepared: ``SchemaError``, and nothing is written."""
        host = host_ms()
        ttl = ttl_s(replay_expiry_ms(self.retention, new, host), host)
        yield Batch(f"replaying job {new.job_id!r}", [
            ("insert_replay", (new.job_id, now_ms, letter.died_ms, letter.attempts, letter.error, ttl)),
            *self._move_rows(old, new),
            ("delete_dead_letter", (job_hash(old.job_id) % DEAD_LETTER_PARTS, old.job_id)),
        ])

    @dual
    def replays(self, job_id: str) -> CqlSteps[list[Replay]]:
        rows = yield Run("select_replays", (job_id,), f"reading the replays of job {job_id!r}")
        return [Replay(job_id, dt_ms(r), dt_ms(d), int(a or 0), e) for r, d, a, e in rows]
