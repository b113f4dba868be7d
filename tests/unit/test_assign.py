from __future__ import annotations

from scheduler.assign import assign, live_shards, owner_of
from scheduler.layout import Layout, Layouts


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
