"""Which poller owns which shard: rendezvous (highest-random-weight) hashing. Pure.

Every member computes the same answer from the same member list, with no coordination
beyond membership. When one of N members joins or leaves, only the shards whose
highest-weight member changed move: about S/N of them, instead of nearly all (kazoo's
SetPartitioner).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import mmh3

from .layout import Layouts


def weight(shard: int, member: str) -> int:
    return int(mmh3.hash(f"{shard}/{member}".encode(), 0x5EED, signed=False))


def owner_of(shard: int, members: Iterable[str]) -> str | None:
    """The member with the highest weight for ``shard`` (ties broken by name)."""
    best: tuple[int, str] | None = None
    for m in members:
        cand = (weight(shard, m), m)
        if best is None or cand > best:
            best = cand
    return None if best is None else best[1]


def assign(shards: Iterable[int], members: Iterable[str]) -> dict[str, set[int]]:
    """``{member: shards}`` for every member (idle members get an empty set).

    Rendezvous hashing with bounded loads: each shard goes to the highest-weight member
    that has fewer than ``ceil(S / N)`` shards. Plain rendezvous hashing can give one
    member 30% more than its share, and the busiest member bounds a fleet's throughput;
    the bound costs a few extra moves on a membership change.
    """
    names = sorted(set(members))
    out: dict[str, set[int]] = {m: set() for m in names}
    todo = sorted(set(shards))
    if not names:
        return out
    cap = -(-len(todo) // len(names))
    for shard in todo:
        for _, member in sorted(((weight(shard, m), m) for m in names), reverse=True):
            if len(out[member]) < cap:
                out[member].add(shard)
                break
    return out


def _order(name: str) -> int:
    """A member's or shard's place in the deterministic spreading order."""
    return int(mmh3.hash(name.encode(), 0x0DE5, signed=False))


def rebalance(prev: Mapping[int, str], shards: Iterable[int], members: Iterable[str]) -> dict[int, str]:
    """``{shard: member}`` from the previous assignment ``prev``: sticky, exactly
    balanced, and moving only what balance requires.

    Every member gets ``S // N`` shards or one more (``S % N`` members get one more: those
    holding the most already). A shard stays with its owner while that owner is a member
    and within its target; the shards of departed members, new shards and each
    member's surplus (its lowest-weight shards) go to the members below target, spread
    in a fixed order. So a join moves exactly the joiner's share and a leave exactly the
    leaver's shards: S/N, the minimum, where ``assign`` moves about twice that. The
    result depends on ``prev``, so the members must agree on it: the fleet publishes it
    (see ``Coordinator.publish_assignment``). O(S + N log N).
    """
    names = sorted(set(members))
    todo = sorted(set(shards))
    if not names:
        return {}
    q, r = divmod(len(todo), len(names))
    held: dict[str, list[int]] = {m: [] for m in names}
    pool: list[int] = []
    for shard in todo:
        owner = prev.get(shard)
        if owner in held:
            held[owner].append(shard)
        else:
            pool.append(shard)
    by_holding = sorted(names, key=lambda m: (-len(held[m]), _order(m), m))
    target = {m: q + (1 if i < r else 0) for i, m in enumerate(by_holding)}
    for m in names:
        surplus = len(held[m]) - target[m]
        if surplus > 0:
            ranked = [sh for _, sh in sorted((weight(sh, m), sh) for sh in held[m])]
            pool.extend(ranked[:surplus])
            held[m] = ranked[surplus:]
    needy = [m for m in sorted(names, key=lambda m: (_order(m), m)) if len(held[m]) < target[m]]
    pool.sort(key=lambda sh: (_order(str(sh)), sh))
    i = 0
    for shard in pool:
        while len(held[needy[i % len(needy)]]) >= target[needy[i % len(needy)]]:
            i += 1
        held[needy[i % len(needy)]].append(shard)
        i += 1
    return {shard: m for m, mine in held.items() for shard in mine}


def live_shards(layouts: Layouts, drained: dict[int, int], width_s: int) -> set[int]:
    """The shards some not-yet-drained bucket still needs.

    Every shard of the latest layout is live. A shard only older layouts have is live
    until its checkpoint (``drained``: shard -> last drained bucket; absent = none yet)
    has passed every bucket those layouts cover: up to the next layout's start, or as
    far as the older layout's writers reached (its mark), whichever is later.
    """
    items = layouts.items
    live = set(range(items[-1].shard_count))
    for i, lay in enumerate(items[:-1]):
        covered_until = max(items[i + 1].from_bucket, lay.mark_end)  # exclusive
        for shard in range(items[-1].shard_count, lay.shard_count):
            done = drained.get(shard)
            if done is None or done + width_s < covered_until:
                live.add(shard)
    return live
