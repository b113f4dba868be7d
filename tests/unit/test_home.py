"""The home-DC rule (domain/home.py), the plan made under it, and a member's clocks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.domain.home import format_weights, groups, home_of, homes, next_away, parse_weights
from scheduler.domain.plan import Plan, decode, encode, next_plan
from scheduler.errors import InvalidInput
from scheduler.fleet.dcs import decode_home, decode_member, encode_home, encode_member
from scheduler.runtime.homedc import DcClocks

DCS = st.sampled_from(["dc1", "dc2", "dc3", "eu-west.1"])
WEIGHTS = st.dictionaries(DCS, st.integers(0, 20), min_size=1).filter(lambda w: any(w.values()))


def test_parse_weights():
    assert parse_weights("dc1=1,dc2=1") == {"dc1": 1, "dc2": 1}
    assert parse_weights(" dc1 = 3 , dc2=0") == {"dc1": 3, "dc2": 0}
    for bad in ("", "dc1", "dc1=x", "dc1=-1", "dc1=1001", "dc1=1,dc1=2", "dc1=0", "d c=1", "dc1=\u0661"):
        with pytest.raises(InvalidInput):
            parse_weights(bad)


@given(st.text(max_size=60))
def test_parse_weights_takes_anything_and_answers_one_line(text):
    try:
        weights = parse_weights(text)
    except InvalidInput as exc:
        assert "\n" not in str(exc)
    else:
        assert parse_weights(format_weights(weights)) == weights


@given(WEIGHTS)
def test_every_shard_has_a_home_of_positive_weight(weights):
    for shard, dc in homes(range(64), weights).items():
        assert weights[dc] > 0 and home_of(shard, weights) == dc


def test_shares_follow_the_weights():
    share = sum(1 for s in range(4096) if home_of(s, {"dc1": 3, "dc2": 1}) == "dc1") / 4096
    assert 0.70 < share < 0.80
    assert homes(range(4), {}) == {}


@given(WEIGHTS, DCS, st.integers(0, 20))
def test_a_weight_change_moves_shards_only_to_or_from_that_dc(weights, dc, new):
    changed = {**weights, dc: new}
    if not any(changed.values()):
        return
    before, after = homes(range(256), weights), homes(range(256), changed)
    for shard in range(256):
        if before[shard] != after[shard]:
            assert dc in (before[shard], after[shard])
            # raised: only towards dc; lowered: only away from it
            assert after[shard] == dc if new > weights.get(dc, 0) else before[shard] == dc


def test_groups():
    dcs = {"a1": "dc1", "a2": "dc1", "b1": "dc2", "x": None}
    w = {"dc1": 1, "dc2": 1}
    home = homes(range(32), w)
    assert groups(range(32), dcs, {}, ()) == [(list(range(32)), ["a1", "a2", "b1", "x"])]
    by = {tuple(m): set(s) for s, m in groups(range(32), dcs, w, ())}
    assert by[("a1", "a2")] == {s for s, d in home.items() if d == "dc1"}
    assert by[("b1",)] == {s for s, d in home.items() if d == "dc2"}
    away = {tuple(m): set(s) for s, m in groups(range(32), dcs, w, ["dc1"])}
    assert away[("b1", "x")] == {s for s, d in home.items() if d == "dc1"}
    empty = {tuple(m): set(s) for s, m in groups(range(32), {"b1": "dc2"}, w, ())}
    assert empty[()] == {s for s, d in home.items() if d == "dc1"}


def test_next_away():
    w = {"dc1": 1, "dc2": 1, "dc3": 0}
    assert next_away(w, (), {"dc1": 29.0}, {"dc2": 5.0}, 30, 30) == frozenset()
    assert next_away(w, (), {"dc1": 30.0, "dc3": 99.0}, {"dc2": 5.0}, 30, 30) == {"dc1"}
    assert next_away(w, ["dc1"], {"dc1": 99.0}, {}, 30, 30) == {"dc1"}
    assert next_away(w, ["dc1"], {}, {"dc1": 10.0}, 30, 30) == {"dc1"}
    assert next_away(w, ["dc1"], {}, {"dc1": 30.0}, 30, 30) == frozenset()


def test_the_plan_under_a_rule():
    w = {"dc1": 1, "dc2": 1}
    dcs = {"a1": "dc1", "a2": "dc1", "b1": "dc2"}
    plan = next_plan(None, dcs, range(16), "a1", 0.0, dcs=dcs, weights=w)
    assert plan is not None and plan.covers() == set(range(16)) and not plan.unowned
    for shard, owner in plan.owners.items():
        assert dcs[owner] == home_of(shard, w)
    assert decode(encode(plan)) == plan
    assert next_plan(plan, dcs, range(16), "a1", 0.0, dcs=dcs, weights=w) is None  # fresh
    # dc1 gone, not failed over yet: its shards belong to nobody
    alone = next_plan(plan, ["b1"], range(16), "b1", 0.0, dcs={"b1": "dc2"}, weights=w)
    assert alone is not None and alone.unowned == {s for s in range(16) if home_of(s, w) == "dc1"}
    assert decode(encode(alone)) == alone
    assert next_plan(alone, ["b1"], range(16), "b1", 0.0, dcs={"b1": "dc2"}, weights=w) is None
    over = next_plan(alone, ["b1"], range(16), "b1", 0.0, dcs={"b1": "dc2"}, weights=w, away=["dc1"])
    assert over is not None and over.shards_of("b1") == set(range(16)) and over.away == {"dc1"}
    # the rule removed: today's plan again
    plain = next_plan(over, ["b1"], range(16), "b1", 0.0)
    assert plain == Plan(("b1",), {s: "b1" for s in range(16)})


def test_member_and_rule_records():
    assert decode_member(encode_member("dc1")) == "dc1"
    assert decode_member(encode_member(None)) is None
    deep = b"[" * 100_000 + b"]" * 100_000  # json.loads raises RecursionError on it
    for junk in (b"\xff", b"[1]", b'{"dc": 5}', b"{", deep):
        assert decode_member(junk) is None
    assert decode_home(encode_home({"dc1": 1})) == {"dc1": 1}
    assert decode_home(b"") == {}
    for junk in (b"\xff", b"{", b'{"v": 2, "weights": {}}', b'{"v": 1, "weights": {"dc1": 0}}',
                 b'{"v": 1, "weights": {"dc1": "1"}}', b'{"v": 1, "weights": {"a b": 1}}', deep):
        with pytest.raises(InvalidInput):
            decode_home(junk)


def test_clocks_fail_over_and_back_after_the_delays():
    now = [0.0]
    clocks = DcClocks(30.0, 10.0, clock=lambda: now[0])
    w = {"dc1": 1, "dc2": 1}
    assert clocks.rule(w, {"b1": "dc2"}, ()).away == frozenset()
    now[0] = 29.9
    assert clocks.rule(w, {"b1": "dc2"}, ()).away == frozenset()
    now[0] = 30.0
    rule = clocks.rule(w, {"b1": "dc2"}, ())
    assert rule.away == {"dc1"} and rule.dcs == ("dc2",)
    assert clocks.rule(w, {"a1": "dc1", "b1": "dc2"}, ["dc1"]).away == {"dc1"}
    now[0] = 40.0
    assert clocks.rule(w, {"a1": "dc1", "b1": "dc2"}, ["dc1"]).away == frozenset()
