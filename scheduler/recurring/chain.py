"""The chain of occurrences: what to write when an occurrence is taken, and whether it
fires. Pure: the schedule, the occurrence and the clock are passed in.

Two steps, at two moments:

- ``successors``, when the poller *reads* occurrence N (before any handler runs): the
  nominal time of N+1, computed from N's nominal time (never from now or from a
  completion: no drift), or, after downtime, the one the misfire policy picks. The
  poller writes it before N can complete, so a crash anywhere between reading N and
  recording it leaves N unrecorded, and the next owner reads N and writes N+1 again
  (the same row: the chain cannot break, nor fork).
- ``decide``, when N is *dispatched*: fire it, or skip it (superseded, paused, misfire,
  overlap), or let it wait (``buffer_one``).

Misfires: an occurrence taken more than ``GRACE_MS`` after its nominal time was missed
(the fleet was down). Within the catch-up window, ``fire_once`` fires only the latest
missed time, ``fire_all`` every one, oldest first (the latest ``FIRE_ALL_CAP``), and
``skip`` none; the chain goes on from the next time after now.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .schedule import Misfire, Occurrence, Overlap, Schedule, State

GRACE_MS = 60_000
# How long a poller may use a decision after its schedule read began; a schedule change
# waits this long before it returns (see poller/occurrences.py).
DECISION_FRESH_S = 0.05
FIRE_ALL_CAP = 100


class Skip(StrEnum):
    OVERLAP = "overlap"
    MISFIRE = "misfire"
    PAUSED = "paused"
    SUPERSEDED = "superseded"


class Previous(StrEnum):
    """The previous occurrence of the same version, as ``decide`` needs it."""

    DONE = "done"  # fired, dead, skipped, or never written
    RUNNING = "running"  # dispatched or waiting for a retry
    WAITING = "waiting"  # buffered behind the one before it


@dataclass(frozen=True)
class Decision:
    fire: bool
    skip: Skip | None = None
    wait: bool = False  # buffer_one: place it again and wait for the running one


def current(s: Schedule | None, occ: Occurrence) -> bool:
    """Whether ``occ`` belongs to the schedule as it is now (not deleted, not updated)."""
    return s is not None and s.state is not State.DELETED and s.version == occ.version


def _oldest_to_fire(s: Schedule, now_ms: int) -> int:
    """Missed times before this are not caught up (the window, and fire_all's cap)."""
    oldest = now_ms - s.catchup_window_s * 1000
    if s.misfire is Misfire.FIRE_ALL:
        capped = s.rule.back(now_ms, FIRE_ALL_CAP)
        if capped is not None:
            oldest = max(oldest, capped)
    return oldest


def successors(s: Schedule | None, occ: Occurrence, now_ms: int) -> list[int]:
    """The nominal times to write when ``occ`` is read: one, or with ``fire_all`` after
    downtime every missed one within the window and the cap, and the next after now."""
    if not current(s, occ) or s is None or s.state is not State.ACTIVE:
        return []  # resume (or the re-created schedule) starts the chain again
    n = occ.nominal_ms
    nxt = s.first_after(n)
    if nxt is None or nxt > now_ms or now_ms - n <= GRACE_MS:
        return [] if nxt is None else [nxt]
    # N+1 is already overdue: the fleet was down.
    if s.misfire is Misfire.SKIP:
        nxt = s.first_after(now_ms)
    elif s.misfire is Misfire.FIRE_ONCE:
        latest = s.rule.back(now_ms)
        nxt = latest if latest is not None and latest >= _oldest_to_fire(s, now_ms) else s.first_after(now_ms)
    else:
        # Every missed time at once (the latest FIRE_ALL_CAP), and the first one after
        # now: they are read together and fire oldest first, instead of one per read.
        oldest = _oldest_to_fire(s, now_ms)
        out: list[int] = []
        t = nxt if nxt >= oldest else s.first_after(oldest - 1)
        while t is not None and len(out) <= FIRE_ALL_CAP:
            out.append(t)
            if t > now_ms:
                break
            t = s.first_after(t)
        return out
    return [] if nxt is None else [nxt]


def decide(s: Schedule | None, occ: Occurrence, now_ms: int, previous: Previous) -> Decision:
    """Fire ``occ`` now, skip it, or let it wait."""
    if not current(s, occ) or s is None:
        return Decision(False, Skip.SUPERSEDED)
    if s.state is State.PAUSED:
        return Decision(False, Skip.PAUSED)
    n = occ.nominal_ms
    if now_ms - n > GRACE_MS:
        if s.misfire is Misfire.SKIP:
            return Decision(False, Skip.MISFIRE)
        if s.misfire is Misfire.FIRE_ONCE and s.rule.back(now_ms) != n:
            return Decision(False, Skip.MISFIRE)  # a later time was missed too: that one fires
        if n < _oldest_to_fire(s, now_ms):
            return Decision(False, Skip.MISFIRE)
    if s.overlap is Overlap.SKIP and previous is not Previous.DONE:
        return Decision(False, Skip.OVERLAP)
    if s.overlap is Overlap.BUFFER_ONE:
        if previous is Previous.WAITING:
            return Decision(False, Skip.OVERLAP)  # one is already waiting
        if previous is Previous.RUNNING:
            return Decision(False, None, wait=True)
    return Decision(True)
