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
"""

from __future__ import annotations

import json
import sys
import zlib
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .assign import rebalance

# A member other than the leader publishes only after the plan has been stale this long
# (the leader died or is cut off between a membership change and its publish).
LEADER_GRACE_S = 3.0


@dataclass(frozen=True)
class Plan:
    members: tuple[str, ...]
    owners: Mapping[int, str] = field(default_factory=dict)

    def shards_of(self, member: str) -> set[int]:
        return {s for s, m in self.owners.items() if m == member}


def encode(plan: Plan) -> bytes:
    index = {m: i for i, m in enumerate(plan.members)}
    shards = sorted(plan.owners)
    spans: list[list[int]] = []
    for shard in shards:
        if spans and spans[-1][0] + spans[-1][1] == shard:
            spans[-1][1] += 1
        else:
            spans.append([shard, 1])
    code = "H" if len(plan.members) < 1 << 16 else "I"
    owners = array(code, (index[plan.owners[s]] for s in shards))
    if sys.byteorder != "little":
        owners.byteswap()
    head = json.dumps({"v": 1, "members": list(plan.members), "shards": spans, "code": code},
                      separators=(",", ":")).encode()
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
        return Plan(members, {s: members[i] for s, i in zip(shards, owners, strict=True)})
    except (ValueError, KeyError, TypeError, IndexError, zlib.error):
        return None


def next_plan(current: Plan | None, members: Iterable[str], live: Iterable[int], me: str,
              stale_for_s: float) -> Plan | None:
    """The plan ``me`` should publish now, or None (the current one stands, or another
    member's turn). The leader (first member by name) publishes as soon as the plan's
    members or shards differ from what it sees; any other member only after the plan
    has been stale for ``LEADER_GRACE_S``, and only for a membership change (the shard
    set is the leader's call: members refresh it at different times, and two views
    would otherwise take turns)."""
    names = tuple(sorted(set(members)))
    shards = set(live)
    if not names or me not in names:
        return None
    same_members = current is not None and current.members == names
    if same_members and current is not None and set(current.owners) == shards:
        return None
    leader = names[0] == me
    if not leader and (same_members or stale_for_s < LEADER_GRACE_S):
        return None
    return Plan(names, rebalance(current.owners if current else {}, shards, names))
