from __future__ import annotations

from scheduler.domain.assign import assign, live_shards, owner_of, rebalance
from scheduler.domain.layout import Layout, Layouts


def test_every_shard_has_exactly_one_owner_and_all_agree():
    members = ["a", "b", "c"]
    plan = assign(range(64), members)
    owned = [s for shards in plan.values() for s in shards]
    assert sorted(owned) == list(range(64))
    assert assign(range(64), list(reversed(members))) == plan
    assert all(owner_of(s, members) in members for s in range(64))


def moved(before: dict[str, set[int]], after: dict[str, set[int]]) -> int:
    where = {s: m for m, shards in before.items() for s in shards}
    return sum(1 for m, shards in after.items() for s in shards if where.get(s) != m)


def test_a_join_or_leave_moves_about_s_over_n():
    shards = range(256)
    for n in (2, 4, 8):
        members = [f"p{i}" for i in range(n)]
        base = assign(shards, members)
        join = moved(base, assign(shards, [*members, "new"]))
        leave = moved(base, assign(shards, members[1:]))
        assert join <= 256 / (n + 1) * 1.3, (n, join)
        assert len(base["p0"]) <= leave <= 256 / n * 1.4, (n, leave)
        assert max(len(v) for v in base.values()) == 256 // n, "loads are bounded by ceil(S/N)"


def test_more_members_than_shards_leaves_some_idle():
    plan = assign(range(2), [f"p{i}" for i in range(5)])
    assert sum(len(v) for v in plan.values()) == 2
    assert sum(1 for v in plan.values() if not v) == 3


def test_shards_of_an_old_layout_stay_live_until_drained_past_it():
    W = 60
    lays = Layouts([Layout(0, 32, mark_end=7200), Layout(3600, 16)])
    assert live_shards(lays, {}, W) == set(range(32))
    drained = {s: 7200 - W for s in range(16, 32)}  # drained through the last covered bucket
    assert live_shards(lays, drained, W) == set(range(16))
    drained[20] = 7200 - 2 * W
    assert live_shards(lays, drained, W) == set(range(16)) | {20}
    grow = Layouts([Layout(0, 8), Layout(3600, 32)])
    assert live_shards(grow, {}, W) == set(range(32))


# --- rebalance: sticky, exactly balanced, minimal movement -------------------------------

def owners(plan: dict[str, set[int]]) -> dict[int, str]:
    return {s: m for m, shards in plan.items() for s in shards}


def check_balanced(out: dict[int, str], shards: list[int], members: list[str]) -> None:
    assert sorted(out) == sorted(shards) and set(out.values()) <= set(members)
    loads = [sum(1 for m in out.values() if m == name) for name in members]
    q = len(shards) // len(members)
    assert min(loads) >= q and max(loads) <= q + 1  # tighter than assign's ceil(S/N) cap


def test_rebalance_from_nothing_is_balanced_and_order_free():
    members = [f"p{i}" for i in range(7)]
    out = rebalance({}, range(100), members)
    check_balanced(out, list(range(100)), members)
    assert rebalance({}, reversed(range(100)), list(reversed(members))) == out
    assert rebalance(out, range(100), members) == out  # a fixed point: nothing moves


def test_rebalance_moves_exactly_the_share_of_who_joined_or_left_on_random_fleets():
    import random

    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 40)
        shards = list(range(rng.randint(1, 700)))
        members = [f"m{rng.getrandbits(32):x}" for _ in range(n)]
        base = rebalance({}, shards, members)
        joiner = f"j{rng.getrandbits(32):x}"
        join = rebalance(base, shards, [*members, joiner])
        check_balanced(join, shards, [*members, joiner])
        moved_join = sum(1 for s in shards if join[s] != base[s])
        assert moved_join == sum(1 for m in join.values() if m == joiner)
        # The old assignment as the oracle: never more moves, and the same load bound.
        old_base = assign(shards, members)
        old_moves = moved(old_base, assign(shards, [*members, joiner]))
        assert moved_join <= max(old_moves, len(shards) // (n + 1) + 1)
        if n > 1:
            leaver = rng.choice(members)
            rest = [m for m in members if m != leaver]
            leave = rebalance(base, shards, rest)
            check_balanced(leave, shards, rest)
            assert {s for s in shards if leave[s] != base[s]} == {s for s, m in base.items() if m == leaver}


def test_rebalance_takes_new_shards_and_drops_dead_ones_moving_only_those():
    members = ["a", "b", "c", "d"]
    base = rebalance({}, range(64), members)
    grown = rebalance(base, range(80), members)
    check_balanced(grown, list(range(80)), members)
    assert all(grown[s] == base[s] for s in range(64))
    shrunk = rebalance(grown, range(48), members)
    check_balanced(shrunk, list(range(48)), members)
    kept = sum(1 for s in range(48) if shrunk[s] == grown[s])
    assert kept >= 48 - 4  # at most the surplus of each member moves


def test_rebalance_with_more_members_than_shards_and_none():
    out = rebalance({}, range(3), ["a", "b", "c", "d", "e"])
    assert sorted(out) == [0, 1, 2] and len(set(out.values())) == 3
    assert rebalance({0: "a"}, range(3), []) == {}
    assert owners(assign(range(3), ["a"])) == rebalance({}, range(3), ["a"])
