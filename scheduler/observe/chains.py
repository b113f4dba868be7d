"""Finding broken chains: an active schedule none of whose two current occurrences
exists (the latest nominal time at or before now, and the next after it). The poller
keeps one of them written at all times; if neither is there, nothing will ever fire
again for that schedule. The exporter reports the count
(``scheduler_recurring_chains_broken``), and ``scheduler recurring check --repair``
restarts them.
"""

from __future__ import annotations

from ..domain.effects import Steps, call, run_sync
from ..recurring.chain import GRACE_MS
from ..recurring.schedule import Schedule, State, occurrence_id
from ..store.roles import ScheduleReads

# Read this many schedules' occurrences in one request.
GROUP = 200


def broken_chains(store: ScheduleReads, now_ms: int,
                  schedules: list[Schedule] | None = None) -> list[Schedule]:
    """The active schedules whose chain is broken. A schedule changed within the last
    minute is not judged yet (its first occurrence may still be on its way)."""
    return run_sync(store, find_broken(now_ms, schedules))


def find_broken(now_ms: int, schedules: list[Schedule] | None = None) -> Steps[list[Schedule]]:
    """``broken_chains`` as effects, for either client."""
    if schedules is None:
        schedules = yield from call("list_schedules")
    candidates: list[tuple[Schedule, list[str]]] = []
    for s in schedules or ():
        if s.state is not State.ACTIVE or now_ms - s.updated_ms < GRACE_MS:
            continue
        nxt = s.first_after(now_ms)
        if nxt is None:
            continue  # past its end: the chain ended as it should
        ids = [occurrence_id(s.schedule_id, s.version, nxt)]
        latest = s.rule.back(now_ms)
        if latest is not None and (s.start_ms is None or latest >= s.start_ms):
            ids.append(occurrence_id(s.schedule_id, s.version, latest))
        candidates.append((s, ids))
    broken: list[Schedule] = []
    for i in range(0, len(candidates), GROUP):
        group = candidates[i:i + GROUP]
        found = yield from call("get_many", [j for _, ids in group for j in ids])
        broken.extend(s for s, ids in group if not any(j in found for j in ids))
    return broken
