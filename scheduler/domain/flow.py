"""Flow control, the pure rules: a kind's limits, the checks of a job's priority and key,
and how a fleet-wide limit is split among the pollers. No I/O; the clock is passed in.

A fleet-wide limit holds because a poller's part falls at once but rises only into what
the others' published parts leave free, and only once they have seen its last one
(``rate_part``, ``slot_part``, ``may_raise``): pollers read at different moments, so
their snapshots differ, and the raise rule, not a shared snapshot, keeps the sum within
the limit. The split is max-min fair (water-filling), not proportional to demand: with a
rate of 10/s, a poller holding 5 jobs of a small key and one holding a backlog of 10,000
get 5/s and 5/s, so the small key is not starved by where its shard lives. What the
demanding pollers do not need is split equally among all, idle ones included, so a job
arriving at an idle poller can start at once (a proportional split would give an idle
poller nothing, and its first job would wait for the next published demand).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import InvalidInput
from .model import check_kind

MAX_KEY_BYTES = 256
PRIORITIES = range(10)  # 0-9; 9 starts first
# A job given no priority sits in the middle, so bulk work (a backfill) can go below the
# normal traffic (0-4), not only urgent work above it. Rows written before schema v007
# read as this too. (domain.model.Job repeats it as its field's default.)
DEFAULT_PRIORITY = 5
# Larger is surely a typo (or an attempt to overflow something downstream).
MAX_LIMIT = 1_000_000_000
# A rate below one per day is surely a typo ("1/d" is not a unit, "0.00001/h" is).
MIN_RATE_PER_S = 1 / 86_400
RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE_RE = re.compile(r"^\s*([^/\s]+)\s*/\s*([^/\s]*)\s*\Z")
# ASCII only: float() would also take "1_000", "nan" and other scripts' digits.
_NUMBER_RE = re.compile(r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\Z", re.ASCII)
_SIGNED_RE = re.compile(r"^\s*[+-]?[0-9]+\s*\Z", re.ASCII)
# What a limit error says to do instead of a value out of range.
_NO_LIMIT = "for no limit, `limits clear` the kind (and set again the limits to keep)"
# Why a start was refused: by the kind's gate (pause, concurrency, rate) or the key's limit.
REASONS = ("paused", "concurrency", "rate", "key")


def _show(value: object) -> str:
    """A value for an error message: repr, cut short (it may be hostile or huge)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_rate(text: object) -> float:
    """``"N/s"``, ``"N/m"`` or ``"N/h"`` -> starts per second. Raises only InvalidInput."""
    if not isinstance(text, str):
        raise InvalidInput(f"rate {_show(text)} is not text: write N/s, N/m or N/h (e.g. 100/s)")
    match = _RATE_RE.match(text[:100])
    if match is None or len(text) > 100:
        raise InvalidInput(f"rate {_show(text)} is not N/s, N/m or N/h: write e.g. 100/s or 30/m")
    number, unit = match.groups()
    if unit not in RATE_UNITS:
        raise InvalidInput(f"rate {_show(text)} has the unknown unit {_show(unit)}: use s, m or h")
    if not _NUMBER_RE.match(number):
        raise InvalidInput(f"rate {_show(text)} does not start with a number: write e.g. 100/s")
    count = float(number)
    return check_rate(count / RATE_UNITS[unit] if math.isfinite(count) else count)


def format_rate(rate_per_s: float) -> str:
    """A rate per second as ``parse_rate`` reads it: per second, else per minute, else per
    hour, the first that shows a number of at least 1 (``0.5`` -> ``"30/m"``), to ten
    significant digits. For people, who set "30/m" and would not recognise 0.5/s."""
    for unit, seconds in (("s", 1.0), ("m", 60.0)):
        if rate_per_s * seconds >= 1 - 1e-9:
            return f"{rate_per_s * seconds:.10g}/{unit}"
    return f"{rate_per_s * 3600:.10g}/h"


def check_rate(rate_per_s: object) -> float:
    """A rate per second, finite, between one a day and 1e9. Raises only InvalidInput."""
    if isinstance(rate_per_s, bool) or not isinstance(rate_per_s, int | float):
        raise InvalidInput(f"rate {_show(rate_per_s)} is not a number: write N/s, N/m or N/h")
    rate = float(rate_per_s)
    if not math.isfinite(rate):
        raise InvalidInput(f"rate {_show(rate_per_s)} is not a finite number: write e.g. 100/s")
    if rate <= 0:
        raise InvalidInput(f"rate {rate:g}/s must be above 0: to stop a kind, use `kinds pause`")
    if rate < MIN_RATE_PER_S:
        raise InvalidInput(f"rate {rate:.6g}/s ({rate * 3600:.6g}/h) is below the lowest rate, "
                           "one a day (0.0417/h)")
    if rate > MAX_LIMIT:
        raise InvalidInput(f"rate {rate:.12g}/s is above the highest rate, {MAX_LIMIT}/s: {_NO_LIMIT}")
    return rate


def parse_count(name: str, value: object) -> int:
    """``check_count`` that also takes the decimal text of a command line."""
    if isinstance(value, str) and _SIGNED_RE.match(value):
        text = value.strip()
        if text.startswith("-") and text.strip("-0"):
            raise InvalidInput(f"{name} {text} must be at least 1: {_NO_LIMIT}")
        digits = text.lstrip("+-").lstrip("0") or "0"
        if len(digits) > 10:  # never parsed whole: a long text is above the limit anyway
            raise InvalidInput(f"{name} {_show(text)} is above the highest, {MAX_LIMIT}: {_NO_LIMIT}")
        value = int(digits)
    return check_count(name, value)


def check_count(name: str, value: object) -> int:
    """A whole number 1..1e9 (an int; a bool is refused). Raises only InvalidInput."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{name} {_show(value)} is not a whole number: give e.g. --{_flag(name)} 10")
    if value < 1:
        raise InvalidInput(f"{name} {value} must be at least 1: {_NO_LIMIT}")
    if value > MAX_LIMIT:
        raise InvalidInput(f"{name} {_show(value)} is above the highest, {MAX_LIMIT}: {_NO_LIMIT}")
    return value


def _flag(name: str) -> str:
    return name.replace("_", "-")


def check_priority(priority: object) -> int:
    """A job's priority: an int 0-9, 9 starts first (a bool is refused)."""
    if type(priority) is not int and isinstance(priority, int) and not isinstance(priority, bool):
        priority = int(priority)  # an IntEnum member, say (type() first: on every queued job)
    if type(priority) is not int or not 0 <= priority <= 9:
        raise InvalidInput(f"priority {_show(priority)} is not a whole number 0-9 (9 starts first)")
    return priority


def parse_priority(text: object) -> int:
    """A priority from a command line or a JSONL field: ``"0"``..``"9"`` or an int 0-9."""
    if isinstance(text, str) and text.strip() in tuple("0123456789"):  # not isdigit(): ASCII only
        text = int(text.strip())
    return check_priority(text)


def check_key(key: object) -> str:
    """A job's fairness key: text of 1..256 UTF-8 bytes with no control characters."""
    if not isinstance(key, str):
        raise InvalidInput(f"key {_show(key)} is not text: give e.g. --key customer-42")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInput(f"key {_show(key)} is not valid UTF-8 (a lone surrogate)") from None
    if size == 0:
        raise InvalidInput("key is empty: omit --key, or give e.g. --key customer-42")
    if size > MAX_KEY_BYTES:
        raise InvalidInput(f"key {_show(key)} is {size} bytes; the limit is {MAX_KEY_BYTES} (UTF-8)")
    if any(unicodedata.category(c) == "Cc" for c in key):
        raise InvalidInput(f"key {_show(key)} contains a control character: use printable text")
    return key


@dataclass(frozen=True)
class Limits:
    """One kind's flow limits; ``None`` is no limit. ``check`` raises only InvalidInput."""

    kind: str
    rate_per_s: float | None = None
    burst: int | None = None
    concurrency: int | None = None
    per_key_concurrency: int | None = None
    paused: bool = False

    def check(self) -> Limits:
        check_kind(self.kind)
        if self.rate_per_s is not None:
            check_rate(self.rate_per_s)
        for name in ("burst", "concurrency", "per_key_concurrency"):
            value = getattr(self, name)
            if value is not None:
                check_count(name, value)
        if self.burst is not None and self.rate_per_s is None:
            raise InvalidInput(f"burst {self.burst} needs a rate: give --rate too (e.g. --rate 100/s)")
        if not isinstance(self.paused, bool):
            raise InvalidInput(f"paused {_show(self.paused)} is not true or false")
        return self

    @property
    def effective_burst(self) -> float:
        """The fleet-wide burst: as set, else a tenth of a second's starts (at least 1)."""
        if self.rate_per_s is None:
            return 0.0
        return float(self.burst) if self.burst is not None else max(1.0, math.ceil(self.rate_per_s / 10))

    @property
    def limited(self) -> bool:
        # Called per finished job on a limited kind: plain tests, no generator.
        return (self.paused or self.rate_per_s is not None or self.concurrency is not None
                or self.per_key_concurrency is not None)

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "rate_per_s": self.rate_per_s, "burst": self.burst,
                "concurrency": self.concurrency, "per_key_concurrency": self.per_key_concurrency,
                "paused": self.paused}

    @classmethod
    def from_json(cls, obj: object) -> Limits:
        """The inverse of ``to_json``; unknown keys and bad values raise InvalidInput."""
        if not isinstance(obj, Mapping):
            raise InvalidInput(f"limits {_show(obj)} are not a JSON object")
        unknown = set(obj) - set(cls.__dataclass_fields__)
        if unknown:
            raise InvalidInput(f"limits have unknown fields {sorted(map(str, unknown))}")
        if "kind" not in obj:
            raise InvalidInput("limits have no kind")
        rate = obj.get("rate_per_s")
        return cls(kind=obj["kind"], rate_per_s=float(rate) if isinstance(rate, int) and not
                   isinstance(rate, bool) else rate, burst=obj.get("burst"),
                   concurrency=obj.get("concurrency"), per_key_concurrency=obj.get("per_key_concurrency"),
                   paused=obj.get("paused", False)).check()


def limits_from(kind: object, rate: object = None, burst: object = None, concurrency: object = None,
                per_key_concurrency: object = None, paused: bool = False) -> Limits:
    """Checked limits from user input: ``rate`` as "N/s|N/m|N/h" text or a number per second,
    the counts as ints or their decimal text. Raises only InvalidInput, naming the bad value."""
    return Limits(
        kind=check_kind(kind),
        rate_per_s=None if rate is None else parse_rate(rate) if isinstance(rate, str) else check_rate(rate),
        burst=None if burst is None else parse_count("burst", burst),
        concurrency=None if concurrency is None else parse_count("concurrency", concurrency),
        per_key_concurrency=(None if per_key_concurrency is None
                             else parse_count("per_key_concurrency", per_key_concurrency)),
        paused=paused,
    ).check()


# --- splitting a fleet-wide limit among the pollers --------------------------------------


class Demand(NamedTuple):
    """What one poller published for one kind: jobs due and waiting plus running, at ``at_ms``."""

    poller: str
    kind: str
    demand: int
    running: int
    at_ms: int
    part: float | None = None  # its part of the kind's rate (None: no rate part published)
    slots: int | None = None  # its part of the kind's concurrency (None: none published)


def fresh(entries: Iterable[Demand], now_ms: int, max_age_ms: int) -> list[Demand]:
    """The entries at most ``max_age_ms`` from ``now_ms`` (either way: a poller whose clock is
    far ahead must not live forever), the newest per (poller, kind). A killed poller drops
    out once its last entry is stale; until then its part stays unused (the safe side)."""
    newest: dict[tuple[str, str], Demand] = {}
    for e in entries:
        if abs(now_ms - e.at_ms) <= max_age_ms:
            seen = newest.get((e.poller, e.kind))
            if seen is None or e.at_ms > seen.at_ms:
                newest[(e.poller, e.kind)] = e
    return sorted(newest.values())


def by_kind(entries: Iterable[Demand]) -> dict[str, dict[str, int]]:
    """kind -> poller -> demand: the snapshot ``share`` and ``slots`` take."""
    out: dict[str, dict[str, int]] = {}
    for e in entries:
        out.setdefault(e.kind, {})[e.poller] = max(0, e.demand)
    return out


def share(total: float, demands: Mapping[str, int], me: str) -> float:
    """My part of a fleet-wide quantity (a rate): max-min fair on the demands, the rest
    split equally among all pollers of the snapshot. The parts sum to ``total`` (within
    float rounding) over the pollers of ``demands``; a poller not in it gets 0 (the others
    do not count it). Deterministic: every poller computes the same split."""
    if me not in demands or total <= 0:
        return 0.0
    need = sorted((max(0, d), name) for name, d in demands.items())
    remaining, left = float(total), len(need)
    part: dict[str, float] = {}
    for d, name in need:
        level = remaining / left
        part[name] = min(float(d), level)
        remaining -= part[name]
        left -= 1
    # What is left when every demand is met (remaining > 0) is split equally.
    return part[me] + max(0.0, remaining) / len(need)


def slots(total: int, demands: Mapping[str, int], me: str) -> int:
    """My part of a fleet-wide count (concurrency): max-min fair in whole slots, the extra
    slots to the largest demands first (ties by poller name), so every poller computes the
    same split and the parts sum to exactly ``total`` over the pollers of ``demands``
    (0 for a poller not in it). When ``total`` is below the number of demanding pollers, the
    largest demands get the slots."""
    if me not in demands or total <= 0:
        return 0
    want = {name: max(0, d) for name, d in demands.items()}
    if sum(want.values()) <= total:
        base, spare = dict(want), total - sum(want.values())
        order = sorted(want, key=lambda n: (-want[n], n))
        even, extra = divmod(spare, len(order))
        return base[me] + even + (1 if order.index(me) < extra else 0)
    # The highest level L at which sum(min(d, L)) <= total, found by bisection.
    lo, hi = 0, max(want.values())
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(d, mid) for d in want.values()) <= total:
            lo = mid
        else:
            hi = mid - 1
    base = {name: min(d, lo) for name, d in want.items()}
    extra = total - sum(base.values())
    above = sorted((n for n in want if want[n] > lo), key=lambda n: (-want[n], n))
    return base[me] + (1 if me in above[:extra] else 0)


def rate_part(total: float, rows: Sequence[Demand], me: str, current: float,
              visible: bool = True) -> float:
    """My next part of a fleet-wide rate: my max-min fair ``share`` of the latest demands,
    lowered at once, but raised only into what the others' published parts leave free, and
    by at most an equal cut of that among *all* the pollers of the snapshot. Pollers that
    raise at the same moment, from the same or older rows, each take at most their cut of
    the same free room, so the parts in force never sum over ``total``: without this, when
    a backlog falls due on every poller at once, the first to look sees the others'
    demands still at 0 and takes the whole rate while the others take theirs.

    ``rows``: the fresh rows of one kind, one per poller, mine included (with my current
    demand). ``current``: my part in force. ``visible``: whether my previous part was in
    the rows I read (the others have seen me); until it is, I never raise, so a poller
    that starts, or comes back after an outage, cannot take a part the others still hold.
    A row without a part counts as its fair share. Deterministic and pure."""
    latest = {r.poller: max(0, r.demand) for r in rows}
    if me not in latest or total <= 0:
        return 0.0
    target = share(total, latest, me)
    if target <= current or not visible:
        return min(target, current)
    others = 0.0
    for r in rows:
        if r.poller != me:
            others += share(total, latest, r.poller) if r.part is None else r.part
    free = max(0.0, total - others - current)
    return min(target, current + free / len(latest))


def slot_part(total: int, rows: Sequence[Demand], me: str, current: int,
              visible: bool = True, published: int | None = None) -> int:
    """My next part of a fleet-wide concurrency, by ``rate_part``'s rule in whole slots: my
    ``slots`` of the latest demands, lowered at once, raised only into what the others'
    published slots leave free and by at most an equal cut of it among all the pollers
    of the snapshot, and only once my previous part was ``visible``. The remainder of the
    cut (fewer slots than pollers) goes one slot each to the first pollers by name among
    those below their share, so the last free slots are not left unused. Without this,
    demand appearing on several pollers in one round gives each the whole limit (each
    sees the others' demand still at 0), and their handlers together run over it. A row
    without slots counts as its ``slots`` share. ``published``: the demand my row the
    others read holds (default: my current one); who is below their share is judged from
    the published demands only, so pollers raising at once agree on it. Deterministic and
    pure."""
    latest = {r.poller: max(0, r.demand) for r in rows}
    if me not in latest or total <= 0:
        return 0
    target = slots(total, latest, me)
    if target <= current or not visible:
        return min(target, current)
    held = {r.poller: (slots(total, latest, r.poller) if r.slots is None else r.slots)
            for r in rows if r.poller != me}
    held[me] = current
    cut, extra = divmod(max(0, total - sum(held.values())), len(latest))
    shown = {**latest, me: latest[me] if published is None else max(0, published)}
    below = sorted(p for p, n in held.items() if n < slots(total, shown, p))
    if me not in below or extra < len(below):
        return min(target, current + cut)
    return min(target, current + cut + (1 if below.index(me) < extra else 0))


# A poller's first raise of a part waits this long after its first publish, and a raise
# computed in a round slower than this is not applied: so a poller whose row another
# could not see yet (both starting) never raises from a view that misses the other.
SETTLE_MS = 1000


def may_raise(others: Iterable[Demand], seen: bool, raised_ms: int | None, skew_ms: int,
              first_ms: int | None = None, now_ms: int = 0) -> bool:
    """Whether my part may rise this round (the ``visible`` of ``rate_part`` and
    ``slot_part``): my row was among those I read (``seen``: the others can see me), my
    first publish (``first_ms``) was at least ``SETTLE_MS`` before this round's read
    (``now_ms``), and every other poller's row was written from a read made after my part
    last rose (``raised_ms``, my clock; ``skew_ms`` covers the others' clocks). Each of
    their parts in force was then computed knowing mine, so a raise of mine never adds to
    one of theirs computed from my older part (a slow round of theirs, two rounds of mine
    within one of theirs); a poller I cannot see yet published after my read, so it waits
    ``SETTLE_MS`` and then sees my raise (rounds slower than that raise nothing)."""
    if raised_ms is None or not seen:
        return False
    if first_ms is not None and now_ms - first_ms < SETTLE_MS:
        return False
    return all(r.at_ms > raised_ms + skew_ms for r in others)

