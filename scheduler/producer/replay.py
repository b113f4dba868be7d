"""Replaying dead letters: a dead job armed again at a time, its attempts reset, its
death kept in the replay's record (``Client.replay_dead``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from ..domain.effects import Steps, call
from ..domain.model import OCCURRENCE_PREFIX, Job, Status, check_due, check_job_id
from ..errors import InvalidInput, JobNotFound
from ..store.base import DeadLetter
from .producer import Producer


def replay_dead(producer: Producer, job_ids: Sequence[str] | None, at: datetime | None) -> Steps[list[Job]]:
    """See ``Client.replay_dead``. A letter whose job is no longer dead (it was moved
    after it died) is not replayed: "all" passes over it, naming it raises
    ``InvalidInput``; replaying it would arm, and fire, a job that is already armed."""
    due_ms = producer.clock.now_ms() if at is None else check_due(at)
    letters: list[DeadLetter] = yield from call("dead_letters")
    dead = {d.job_id: d for d in letters}
    # An occurrence is not replayed: its schedule already wrote the next one, and the
    # poller would skip an old occurrence as a misfire anyway. "All" passes them over;
    # naming one is an error that says so.
    if job_ids is None:
        wanted = [j for j in dead if not j.startswith(OCCURRENCE_PREFIX)]
    else:
        wanted = list(dict.fromkeys(job_ids))  # an id named twice is replayed once
        missing = [j for j in wanted if j not in dead]
        if missing:
            raise JobNotFound(f"not in the dead letters: {', '.join(missing[:5])} "
                              "(scheduler dead list shows them)")
        for job_id in wanted:
            check_job_id(job_id)
    out = []
    for job_id in wanted:
        old = yield from producer.get(job_id)
        if old.status is not Status.DEAD:
            if job_ids is None:
                continue
            raise InvalidInput(f"job {job_id!r} is {old.status}, not dead: it was armed again after it "
                               "died, so there is nothing to replay")
        new = yield from producer.place(job_id, old.kind, old.data, old.data_json, due_ms, 0,
                                        old.priority, old.key, None, traceparent=old.traceparent)
        # A pending job that has not fired since: no fired_at (its death's time is
        # kept in the replay's record, with what the dead letter said).
        new = new.evolve(attempts=0, fired_ms=None, last_error=old.last_error)
        yield from producer.ensure_marks([new])
        yield from call("replay_dead_letter", old, new, dead[job_id], producer.clock.now_ms())
        out.append(new)
    return out
