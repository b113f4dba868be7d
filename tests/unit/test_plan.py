"""The published plan: its encoding and whose turn it is to publish."""

from __future__ import annotations

import zlib

from scheduler.domain.assign import rebalance
from scheduler.domain.plan import LEADER_GRACE_S, Plan, decode, encode, next_plan


def test_encoding_round_trips_and_is_small_at_scale():
    members = tuple(sorted(f"poller-{i:04d}" for i in range(1000)))
    plan = Plan(members, rebalance({}, range(16384), members))
    data = encode(plan)
    assert decode(data) == plan
    assert len(data) < 200_000  # far under ZooKeeper's 1 MB node limit
    assert decode(encode(Plan(("a",), {}))) == Plan(("a",), {})


def test_unreadable_data_is_no_plan():
    assert decode(b"") is None
    assert decode(b"not zlib") is None
    assert decode(zlib.compress(b'{"v": 2, "members": [], "shards": []}\n')) is None
    bad_index = b'{"v": 1, "members": ["a"], "shards": [[0, 1]], "code": "H"}\n\x05\x00'
    assert decode(zlib.compress(bad_index)) is None


def test_the_leader_publishes_at_once_and_the_others_only_after_the_grace():
    live = range(8)
    assert next_plan(None, ["b", "a"], live, "b", 0.0) is None
    first = next_plan(None, ["b", "a"], live, "a", 0.0)
    assert first is not None and first.members == ("a", "b") and sorted(first.owners) == list(live)
    assert next_plan(first, ["a", "b"], live, "a", 0.0) is None  # fresh: nothing to do
    # c joined; the leader is still a
    assert next_plan(first, ["a", "b", "c"], live, "c", 0.0) is None
    late = next_plan(first, ["a", "b", "c"], live, "c", LEADER_GRACE_S)
    assert late is not None and late.members == ("a", "b", "c")
    # a left: b leads now and publishes at once
    assert next_plan(first, ["b"], live, "b", 0.0) is not None
    # A new shard set is the leader's call only, however stale.
    assert next_plan(first, ["a", "b"], range(10), "b", 60.0) is None
    grown = next_plan(first, ["a", "b"], range(10), "a", 0.0)
    assert grown is not None and all(grown.owners[s] == first.owners[s] for s in live)
    assert next_plan(first, ["a", "b"], live, "z", 60.0) is None  # not a member
