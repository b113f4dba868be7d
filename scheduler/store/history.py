"""What a store keeps of a job's past beyond its own rows: the replays of its dead
letters (schema v005). A replay re-arms the job in place (attempts back to 0, no
``fired_at``) and removes its dead letter, so without this record nothing would say that
a pending job had died before, when, or why."""

from __future__ import annotations

from dataclasses import dataclass

from ..domain.model import Job
from ..domain.retention import Retention


@dataclass(frozen=True)
class Replay:
    """One replay of a dead letter: when, and what the dead letter said then."""

    job_id: str
    replayed_ms: int
    died_ms: int
    attempts: int
    error: str | None


def replay_expiry_ms(retention: Retention, new: Job, now_ms: int) -> int:
    """When a replay's record expires: not before the replayed job's rows (a retention
    after its new fire time), nor before a dead letter written now would."""
    return max(retention.after_fire_ms(new.fire_ms), retention.dead_lookup_ms(now_ms))
