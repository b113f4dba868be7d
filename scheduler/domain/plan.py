"""The fleet's published assignment: which member owns which shard, and the member list
it was computed for. Pure: the encoding of the znode (``/root/assignment``) and the rule
for when a member publishes a new one.

``assign.rebalance`` is sticky: its result depends on the previous assignment, so every
member must start from the same one. One member publishes (compare-and-set on the
znode's version), the others follow what is published. Ownership itself stays with the
shard locks and their fencing tokens: two members that briefly disagree about the plan
only contend for a lock; neither fires a shard it does not hold.

Encoding, zlib-compressed: a JSON line ``{"v": 1, "members": [...], "shards": [[first,
count], ...], "code": "H"}`` then each shard's owner as an index into ``members``
(unsigned 16-bit little-endian; 32-bit past 65,535 members). 16,384 shards over 1,000
members is about 30 KB, under ZooKeeper's 1 MB node limit; every member reads it once
per change.

With a home-DC rule (``home.py``) the head also holds ``"home": {"weights": {DC: W},
"away": [DC...], "dcs": [member's DC or null, ...], "none": [[first, count], ...]}``:
the rule, the home DCs served by other DCs, each member's DC, and the shards nobody may
own (their home DC is absent and not yet failed over). A plan without it is today's.
"""

from __future__ import annotations

import json
import sys
import zlib
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .assign import rebalance
from .home import groups

# A member other than the leader publishes only after the plan has been stale this long
# (the leader died or is cut off between a membership change and its publish).
LEADER_GRACE_S = 3.0


@dataclass(frozen=True)
class Plan:
    members: tuple[str, ...]
    owners: Mapping[int, str] = field(default_factory=dict)
    # The home-DC rule the plan was made under (empty: none, every member eligible).
    weights: Mapping[str, int] = field(default_factory=dict)
    away: frozenset[str] = frozenset()
    dcs: tuple[str | None, ...] = ()  # each member's DC, with a rule only
    unowned: frozenset[int] = frozenset()  # live shards no member may own right now

    def shards_of(self, member: str) -> set[int]:
        return {s for s, m in self.owners.items() if m == member}

    def covers(self) -> set[int]:
        """Every live shard the plan was made for, owned or not."""
        return set(self.owners) | set(self.unowned)

    def dc_of(self, member: str) -> str | None:
        if not self.dcs or member not in self.members:
            return None
        return self.dcs[self.members.index(member)]


def _spans(shards: Iterable[int]) -> list[list[int]]:
    spans: list[list[int]] = []
    for shard in sorted(shards):
        if spans and spans[-1][0] + spans[-1][1] == shard:
            spans[-1][1] += 1
        else:
            spans.append([shard, 1])
    return spans


def encode(plan: Plan) -> bytes:
    index = {m: i for i, m in enumerate(plan.members)}
    shards = sorted(plan.owners)
    spans = _spans(shards)
    code = "H" if len(plan.members) < 1 << 16 else "I"
    owners = array(code, (index[plan.owners[s]] for s in shards))
    if sys.byteorder != "little":
        owners.byteswap()
    doc: dict[str, object] = {"v": 1, "members": list(plan.members), "shards": spans, "code": code}
    if plan.weights:
        doc["home"] = {"weights": dict(plan.weights), "away": sorted(plan.away), "dcs": list(plan.dcs),
                       "none": _spans(plan.unowned)}
    head = json.dumps(doc, separators=(",", ":")).encode()
    return zlib.compress(head + b"\n" + owners.tobytes(), 6)


def decode(data: bytes) -> Plan | None:
    """The plan in ``data``; None for an empty node or one this version cannot read (it
    is then replaced, as if there were none)."""
    if not data:
        return None
    try:
        head, _, body = zlib.decompress(data).partition(b"\n")
        doc = json.loads(head)
        if doc.get("v") != 1:
            return None
        members = tuple(str(m) for m in doc["members"])
        owners = array(doc["code"])
        owners.frombytes(body)
        if sys.byteorder != "little":
            owners.byteswap()
        shards = [first + k for first, count in doc["shards"] for k in range(count)]
        if len(shards) != len(owners):
            return None
        owned = {s: members[i] for s, i in zip(shards, owners, strict=True)}
        home = doc.get("home")
        if not home:
            return Plan(members, owned)
        dcs = tuple(None if d is None else str(d) for d in home["dcs"])
        if len(dcs) != len(members):
            return None
        return Plan(members, owned, {str(k): int(v) for k, v in home["weights"].items()},
                    frozenset(str(d) for d in home["away"]), dcs,
                    frozenset(first + k for first, count in home["none"] for k in range(count)))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, zlib.error):
        return None


def next_plan(current: Plan | None, members: Iterable[str], live: Iterable[int], me: str,
              stale_for_s: float, *, dcs: Mapping[str, str | None] | None = None,
              weights: Mapping[str, int] | None = None, away: Iterable[str] = ()) -> Plan | None:
    """The plan ``me`` should publish now, or None (the current one stands, or another
    member's turn). The leader (first member by name) publishes as soon as the plan's
    members, shards or home-DC rule (``weights``, ``away``) differ from what it sees;
    any other member only after the plan has been stale for ``LEADER_GRACE_S``, and
    only for a membership change (the shard set and the rule are the leader's call:
    members refresh them at different times, and two views would otherwise take turns).

    With ``weights`` (``home.py``), each group of shards is rebalanced among the members
    that may own it (``dcs``: each member's DC); shards of a group with no member stay
    unowned. Without, this is plain ``rebalance`` over every member."""
    names = tuple(sorted(set(members)))
    shards = set(live)
    if not names or me not in names:
        return None
    rule = {dc: w for dc, w in (weights or {}).items()}
    gone = frozenset(away) if rule else frozenset()
    member_dcs = {m: (dcs or {}).get(m) for m in names}
    dc_list = tuple(member_dcs[m] for m in names) if rule else ()
    same_members = current is not None and current.members == names and current.dcs == dc_list
    if (same_members and current is not None and current.covers() == shards
            and dict(current.weights) == rule and current.away == gone):
        return None
    leader = names[0] == me
    if not leader and (same_members or stale_for_s < LEADER_GRACE_S):
        return None
    prev = current.owners if current else {}
    if not rule:
        return Plan(names, rebalance(prev, shards, names))
    owners: dict[int, str] = {}
    unowned: set[int] = set()
    for mine, eligible in groups(shards, member_dcs, rule, gone):
        if eligible:
            owners.update(rebalance(prev, mine, eligible))
        else:
            unowned.update(mine)
    return Plan(names, owners, rule, gone, dc_list, frozenset(unowned))
