"""A fleet member's view of the home-DC rule (``domain/home.py``): how long each home
DC has had, or lacked, a live member, and so which DCs are away (served by the others).

Each member keeps its own clocks, started when it first saw the DC in that state: a
member that starts, or becomes the leader, waits a whole delay before it fails a DC
over or back. It never acts sooner than the delay after the DC's last member went
from ZooKeeper (its node goes at once on a planned stop or a step-out, and with its
session, up to ``--session-timeout`` later, when it is killed or cut off).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ..domain.home import next_away


@dataclass(frozen=True)
class Rule:
    """The rule in force as this member sees it: hashable, so a change of any part is
    a change of the plan's inputs."""

    weights: tuple[tuple[str, int], ...]
    dcs: tuple[str | None, ...]  # each member's DC, members sorted by name
    away: frozenset[str]


class DcClocks:
    def __init__(self, failover_s: float, failback_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.failover_s, self.failback_s = failover_s, failback_s
        self._clock = clock
        self._absent_since: dict[str, float] = {}
        self._present_since: dict[str, float] = {}

    def rule(self, weights: Mapping[str, int], dcs: Mapping[str, str | None],
             away: Iterable[str]) -> Rule:
        """The rule now, from ``away`` (the published plan's) and the clocks, which this
        call advances with ``dcs`` (live members and their DCs)."""
        now = self._clock()
        have = {d for d in dcs.values() if d}
        for dc in weights:
            if dc in have:
                self._absent_since.pop(dc, None)
                self._present_since.setdefault(dc, now)
            else:
                self._present_since.pop(dc, None)
                self._absent_since.setdefault(dc, now)
        absent = {dc: now - t for dc, t in self._absent_since.items()}
        present = {dc: now - t for dc, t in self._present_since.items()}
        gone = next_away(weights, away, absent, present, self.failover_s, self.failback_s)
        return Rule(tuple(sorted(weights.items())), tuple(dcs[m] for m in sorted(dcs)), gone)
