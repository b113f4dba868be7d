"""The storage interface's part for flow control (``Store`` inherits it): the limits
and pauses an operator sets per kind (``flow_limits``), and the demand each poller
publishes per kind (``flow_demand``), which a fleet reads to split a kind's budget.

Semantics, the same in both stores:

- ``set_limits`` writes only the fields it is given (None: keep the stored value), and
  never touches the pause: ``limits set KIND --rate 5/s`` after ``--concurrency 3`` keeps
  the concurrency. A call that gives no field writes nothing.
- ``clear_limits`` removes the four limits and keeps the pause: ``limits clear`` and
  ``kinds pause/resume`` are separate controls, so clearing a paused kind's limits
  never fires its held jobs.
- ``flow_limits`` returns the domain's ``Limits``, one per kind with a limit or a pause:
  a row with neither (cleared and resumed) is the same as no row.
- ``publish_demand`` upserts one row per (poller, kind); a kind the poller stops
  publishing ages out (Cassandra: a TTL of ``DEMAND_TTL_S``; SQLite: readers drop it by
  ``at_ms`` and the next publish purges it). ``demands`` returns the domain's ``Demand``
  rows that ``domain.flow.fresh`` keeps: at most ``max_age_ms`` from now.

Inputs are checked here before anything is written (``InvalidInput``), by the domain's
rules (``domain.flow``) where it has one: callers validate user text first, but a store
must never write a value it cannot read back.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from ..domain.flow import MAX_LIMIT, MIN_RATE_PER_S, Demand, Limits, check_count, check_rate, fresh
from ..domain.model import check_kind
from ..errors import InvalidInput

# A published demand row lives this long unless written again: a poller publishes
# every ~1 s, so a killed poller's share is gone from every reader within 10 s.
DEMAND_TTL_S = 10
# Cassandra's int and bigint columns. The limit counts need no check of their own:
# the domain's bound (domain.flow.MAX_LIMIT, 1e9) is below INT32_MAX.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
MAX_POLLER_BYTES = 256
LIMIT_FIELDS = ("rate_per_s", "burst", "concurrency", "per_key_concurrency")


def _int(name: str, value: object, low: int, high: int) -> int:
    """A time or a demand counter (the domain has no rule for these): an int in range."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"{name} must be an integer from {low} to {high}, got {value!r}")
    return value


def check_limits(kind: object, rate_per_s: object, burst: object, concurrency: object,
                 per_key_concurrency: object, now_ms: object) -> dict[str, Any]:
    """The limit fields given (not None), checked by the domain's rules (``check_kind``,
    ``check_rate``, ``check_count``): ``InvalidInput`` for a bad value, naming it. An int
    rate comes back as a float. Not ``Limits.check``: a call that gives a burst alone
    keeps the stored rate, which this call cannot see."""
    check_kind(kind)
    _int("now_ms", now_ms, 0, INT64_MAX)
    given: dict[str, Any] = {}
    if rate_per_s is not None:
        given["rate_per_s"] = check_rate(rate_per_s)
    for name, value in (("burst", burst), ("concurrency", concurrency),
                        ("per_key_concurrency", per_key_concurrency)):
        if value is not None:
            given[name] = check_count(name, value)
    return given


def check_pause(kind: object, paused: object, now_ms: object) -> bool:
    """``paused``, checked with the kind and the time: ``InvalidInput`` else."""
    check_kind(kind)
    _int("now_ms", now_ms, 0, INT64_MAX)
    if not isinstance(paused, bool):
        raise InvalidInput(f"paused must be True or False, got {paused!r}")
    return paused


def check_poller(poller: object) -> str:
    if not isinstance(poller, str) or not poller:
        raise InvalidInput("poller name must be a non-empty string")
    try:
        size = len(poller.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInput("poller name must be valid UTF-8 (it contains a lone surrogate)") from None
    if size > MAX_POLLER_BYTES:
        raise InvalidInput(f"poller name is {size} bytes; the limit is {MAX_POLLER_BYTES}")
    return poller


# What a poller publishes per kind: (kind, demand, running), with its rate part
# (kind, demand, running, part), or with its rate part and slots (..., part, slots).
DemandEntry = (tuple[str, int, int] | tuple[str, int, int, float | None]
               | tuple[str, int, int, float | None, int | None])
CheckedDemand = tuple[str, int, int, float | None, int | None]


def check_demand(poller: object, entries: object, now_ms: object) -> list[CheckedDemand]:
    """``entries`` as ``(kind, demand, running[, part[, slots]])`` tuples, checked:
    ``InvalidInput`` for a bad poller name or kind, a negative or oversized count, a part
    that is not a finite number from 0 up, or a kind given twice. Returned with the part
    and the slots (None when not given)."""
    check_poller(poller)
    _int("now_ms", now_ms, 0, INT64_MAX)
    if isinstance(entries, str | bytes) or not isinstance(entries, Sequence):
        raise InvalidInput("demand entries must be a sequence of (kind, demand, running)")
    out: list[CheckedDemand] = []
    seen: set[str] = set()
    for entry in entries:
        if not isinstance(entry, tuple | list) or len(entry) not in (3, 4, 5):
            raise InvalidInput("a demand entry must be (kind, demand, running[, part[, slots]]), "
                               f"got {entry!r}")
        kind, demand, running = entry[:3]
        part = entry[3] if len(entry) >= 4 else None
        slots = entry[4] if len(entry) == 5 else None
        if part is not None and (isinstance(part, bool) or not isinstance(part, int | float)
                                 or not math.isfinite(part) or part < 0):
            raise InvalidInput(f"a rate part must be a finite number from 0 up, got {part!r}")
        check_kind(kind)
        if kind in seen:
            raise InvalidInput(f"kind {kind!r} is given twice in one demand report")
        seen.add(kind)
        out.append((kind, _int("demand", demand, 0, INT64_MAX), _int("running", running, 0, INT32_MAX),
                    None if part is None else float(part),
                    None if slots is None else _int("slots", slots, 0, INT32_MAX)))
    return out


def check_age(now_ms: object, max_age_ms: object) -> int:
    """The oldest ``at_ms`` a reader keeps."""
    return _int("now_ms", now_ms, 0, INT64_MAX) - _int("max_age_ms", max_age_ms, 0, INT64_MAX)


def limits_rows(rows: Sequence[Sequence[Any]]) -> list[Limits]:
    """``(kind, rate, burst, concurrency, per_key, paused, updated_ms)`` rows as Limits, by
    kind, without the rows with no limit and no pause (the same as no row). ``updated_ms``
    is written for whoever reads the table by hand; no caller needs it. A value written
    outside the store (by cqlsh, say) that the store would refuse reads as no such limit
    (a rate below the floor as the floor), so one bad row can stop neither the pollers'
    reads nor their arithmetic; a row whose kind is not text is skipped."""
    out = []
    for k, r, b, c, p, z, _updated_ms in rows:
        try:
            check_kind(k)
        except InvalidInput:
            continue  # a kind the store would refuse: no poller could publish it
        out.append(Limits(k, _stored_rate(r), _stored_count(b), _stored_count(c), _stored_count(p),
                          z is True or z == 1))
    return sorted((f for f in out if f.paused or any(getattr(f, n) is not None for n in LIMIT_FIELDS)),
                  key=lambda f: f.kind)


def _stored_rate(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value <= 0:
        return None
    return min(max(float(value), MIN_RATE_PER_S), float(MAX_LIMIT))


def _stored_count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return min(value, int(MAX_LIMIT))


def demand_rows(rows: Sequence[Sequence[Any]], now_ms: int, max_age_ms: int) -> list[Demand]:
    """``(poller, kind, demand, running, at_ms, part, slots)`` rows as the domain's
    ``fresh`` keeps them (at most ``max_age_ms`` from ``now_ms``, either way), by poller and
    kind. A part or slots value that is not a number from 0 up (written outside this
    code) reads as None: that poller's part is then estimated from its demand."""
    return fresh((Demand(p, k, d, r, a, _part(x), _slots(n)) for p, k, d, r, a, x, n in rows
                  if isinstance(p, str) and isinstance(k, str) and all(
                      isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (d, r, a))),
                 now_ms, max_age_ms)


def _part(value: Any) -> float | None:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _slots(value: Any) -> int | None:
    if value is None or isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= INT32_MAX else None


class FlowTables(ABC):
    """Flow control's rows: limits and pauses per kind, and the pollers' demand. A store
    older than v006 raises ``SchemaError`` for each, and writes nothing."""

    @abstractmethod
    def set_limits(self, kind: str, rate_per_s: float | None, burst: int | None,
                   concurrency: int | None, per_key_concurrency: int | None, now_ms: int) -> None:
        """Set the limit fields given (None: keep the stored one), keeping the pause;
        atomic (one single-partition batch in Cassandra, one transaction in SQLite).
        ``InvalidInput`` for a bad value: nothing is written."""

    @abstractmethod
    def set_paused(self, kind: str, paused: bool, now_ms: int) -> None:
        """Pause or resume ``kind``, keeping its limits. Idempotent."""

    @abstractmethod
    def clear_limits(self, kind: str) -> None:
        """Remove ``kind``'s four limits, keeping its pause. Idempotent."""

    @abstractmethod
    def flow_limits(self) -> list[Limits]:
        """Every kind with a limit or a pause, by kind: one read (Cassandra: one
        partition), cheap enough for every poller to call each second."""

    @abstractmethod
    def publish_demand(self, poller: str, entries: Sequence[DemandEntry], now_ms: int) -> None:
        """Record ``(kind, demand, running[, part[, slots]])`` for each entry as ``poller``'s latest, at
        ``now_ms``. Idempotent; ``InvalidInput`` for a bad entry, and nothing is written.
        A failure part-way (Cassandra, more than one batch) leaves some kinds updated:
        each row stands alone, and the next publish rewrites them all."""

    @abstractmethod
    def demands(self, now_ms: int, max_age_ms: int) -> list[Demand]:
        """Every poller's rows published at most ``max_age_ms`` before (or after: a
        publisher whose clock runs far ahead) ``now_ms``, by poller and kind: one read."""
