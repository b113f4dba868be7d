"""Which data centre (DC) is each shard's home, and which members may own it. Pure.

The rule is a weight per DC (``dc1=1,dc2=1``): weighted rendezvous hashing. For each
shard every DC of positive weight draws a score ``-ln(u) / weight`` (``u`` in (0, 1) from
a hash of shard and DC) and the lowest score wins. A DC's expected share of the shards is
its weight over the sum of weights, with no stored state, and a change of weights moves
only what it must: raising one DC's weight moves shards to that DC only, lowering it
moves shards away from it only, adding a DC takes shards from the others only (each
shard's score under every other DC is unchanged). This is weighted rendezvous
hashing (https://en.wikipedia.org/wiki/Rendezvous_hashing#Weighted_rendezvous_hash).

Members of a shard's home DC own it. When the home DC is *away* (no live member there
for the fail-over delay: ``next_away``), members of every other DC may own it, until the
home DC has had a live member for the fail-back delay.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

import mmh3

from ..errors import InvalidInput

MAX_WEIGHT = 1000
_DC_RE = re.compile(r"^[A-Za-z0-9_.-]{1,48}\Z")
WEIGHTS_FORM = "DC=WEIGHT[,DC=WEIGHT...], e.g. dc1=1,dc2=1 (weights 0 to 1000, one above 0)"


def parse_weights(text: str) -> dict[str, int]:
    """``{"dc1": 1, "dc2": 1}`` from ``dc1=1,dc2=1``. ``InvalidInput`` (one line) for
    anything else: a malformed pair, a DC named twice, a weight outside 0 to 1000, or
    no weight above 0 (a rule that homes no shard anywhere)."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput(f"no DC weights given: use {WEIGHTS_FORM}")
    out: dict[str, int] = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not _DC_RE.match(name):
            raise InvalidInput(f"{_shown(part)} is not DC=WEIGHT: use {WEIGHTS_FORM}")
        if not value.isascii() or not value.isdigit() or int(value) > MAX_WEIGHT:
            raise InvalidInput(f"the weight of {name} ({_shown(value)}) must be a whole number from 0 to "
                               f"{MAX_WEIGHT}")
        if name in out:
            raise InvalidInput(f"DC {name} is named twice: give each DC one weight")
        out[name] = int(value)
    if not any(out.values()):
        raise InvalidInput("every weight is 0, so no DC would be home to any shard: "
                           "give one a weight above 0")
    return out


def format_weights(weights: Mapping[str, int]) -> str:
    return ",".join(f"{dc}={w}" for dc, w in sorted(weights.items()))


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "...")


def _score(shard: int, dc: str, weight: int) -> float:
    h = mmh3.hash(f"{shard}@{dc}".encode(), 0x40E5, signed=False)
    u = (h + 0.5) / 2**32  # in (0, 1): never log(0)
    return -math.log(u) / weight


def home_of(shard: int, weights: Mapping[str, int]) -> str | None:
    """The home DC of ``shard`` (ties broken by name); None when no DC has a weight."""
    best: tuple[float, str] | None = None
    for dc, w in weights.items():
        if w > 0:
            cand = (_score(shard, dc, w), dc)
            if best is None or cand < best:
                best = cand
    return None if best is None else best[1]


def homes(shards: Iterable[int], weights: Mapping[str, int]) -> dict[int, str]:
    """``{shard: home DC}``; empty when no rule is set."""
    if not any(w > 0 for w in weights.values()):
        return {}
    return {s: home_of(s, weights) or "" for s in shards}


def groups(shards: Iterable[int], dcs: Mapping[str, str | None], weights: Mapping[str, int],
           away: Iterable[str]) -> list[tuple[list[int], list[str]]]:
    """The shards split into groups, each with the members that may own it:
    ``[(shards, members)]``. ``dcs``: every live member and its DC (None: it named
    none). No rule: one group, every member. Otherwise a shard's members are those of
    its home DC, or, with the home DC ``away``, those of every other DC (a member with
    no DC included). A group may have no member: its shards are then owned by nobody."""
    names = sorted(dcs)
    todo = sorted(set(shards))
    if not any(w > 0 for w in weights.values()):
        return [(todo, names)]
    gone = set(away)
    by_home: dict[str, list[int]] = {}
    for shard in todo:
        by_home.setdefault(home_of(shard, weights) or "", []).append(shard)
    out: dict[tuple[str, ...], list[int]] = {}
    for home, mine in sorted(by_home.items()):
        if home in gone:
            members = tuple(m for m in names if dcs[m] != home)
        else:
            members = tuple(m for m in names if dcs[m] == home)
        out.setdefault(members, []).extend(mine)
    return [(sorted(sh), list(ms)) for ms, sh in out.items()]


def next_away(weights: Mapping[str, int], away: Iterable[str], absent_for: Mapping[str, float],
              present_for: Mapping[str, float], failover_s: float, failback_s: float) -> frozenset[str]:
    """The home DCs whose shards other DCs should serve now. ``absent_for``: seconds
    each DC has had no live member (DCs with a member absent); ``present_for``: seconds
    each has had one (DCs with none absent). A DC goes away after ``failover_s`` without
    a member and comes back after ``failback_s`` with one; a DC without weight is never
    away (it is nobody's home)."""
    out, gone = set(), set(away)
    for dc, w in weights.items():
        if w <= 0:
            continue
        if dc in gone:
            if present_for.get(dc, -1.0) < failback_s:
                out.add(dc)
        elif absent_for.get(dc, -1.0) >= failover_s:
            out.add(dc)
    return frozenset(out)
