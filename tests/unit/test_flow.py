"""Flow control, the pure rules: limits and their checks, the fleet split, the kind gates."""

from __future__ import annotations

import contextlib
import heapq
import math
import random
import re
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.domain.flow import (
    SETTLE_MS,
    Demand,
    Limits,
    by_kind,
    check_key,
    check_priority,
    fresh,
    limits_from,
    may_raise,
    parse_count,
    parse_priority,
    parse_rate,
    rate_part,
    share,
    slot_part,
    slots,
)
from scheduler.domain.gates import Gates, KindGate
from scheduler.errors import InvalidInput


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# --- limits and checks --------------------------------------------------------------------


@pytest.mark.parametrize(("text", "per_s"), [
    ("100/s", 100.0), ("30/m", 0.5), ("3600/h", 1.0), (" 2.5 / s ", 2.5), ("1e3/s", 1000.0),
    ("24/h", 24 / 3600), ("1/h", 1 / 3600),
])
def test_parse_rate(text, per_s):
    assert parse_rate(text) == pytest.approx(per_s)


@pytest.mark.parametrize(("text", "says"), [
    ("0/s", "above 0"), ("-1/s", "above 0"), ("5/d", "unknown unit"), ("5/ms", "unknown unit"),
    ("5", "N/s"), ("five/s", "number"), ("nan/s", "number"), ("inf/s", "number"),
    ("1e400/s", "finite"), ("2e9/s", "above"), ("1/s/s", "N/s"), ("", "N/s"), ("\u0665/s", "number"),
    ("1_000/s", "number"), ("0.01/h", "one a day"), (5, "not text"), (None, "not text"),
])
def test_parse_rate_refuses_with_one_line(text, says):
    with pytest.raises(InvalidInput) as err:
        parse_rate(text)
    assert says in str(err.value)
    assert "\n" not in str(err.value)


def test_limits_from_user_input_and_json_keys():
    lim = limits_from("email", rate="600/m", burst="20", concurrency=5, per_key_concurrency="2")
    assert lim == Limits("email", 10.0, 20, 5, 2, False)
    assert list(lim.to_json()) == ["kind", "rate_per_s", "burst", "concurrency",
                                   "per_key_concurrency", "paused"]
    assert Limits.from_json(lim.to_json()) == lim
    assert limits_from("email", rate=2) == Limits("email", 2.0)
    assert Limits("x", rate_per_s=100.0).effective_burst == 10
    assert Limits("x", rate_per_s=0.5).effective_burst == 1
    assert Limits("x", rate_per_s=5.0, burst=3).effective_burst == 3
    assert not Limits("x").limited and Limits("x", paused=True).limited


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"kind": "bad kind"}, "kind"), ({"kind": ""}, "kind"), ({"kind": 5}, "kind"),
    ({"rate": "0/s"}, "above 0"), ({"rate": -3.0}, "above 0"), ({"rate": math.nan}, "finite"),
    ({"rate": True}, "not a number"), ({"rate": 1e10}, "above"),
    ({"rate": "1/s", "burst": 0}, "at least 1"), ({"burst": 5}, "needs a rate"),
    ({"concurrency": 0}, "at least 1"), ({"concurrency": -1}, "at least 1"),
    ({"concurrency": 2.5}, "whole number"), ({"concurrency": True}, "whole number"),
    ({"concurrency": 10**10}, "above"), ({"per_key_concurrency": "x"}, "whole number"),
])
def test_limits_from_refuses(kwargs, says):
    kwargs = {"kind": "email", **kwargs}
    with pytest.raises(InvalidInput) as err:
        limits_from(**kwargs)
    assert says in str(err.value)


def test_limits_check_is_strict_about_types():
    with pytest.raises(InvalidInput):
        Limits("email", rate_per_s=1.0, burst="5").check()  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        Limits("email", paused="yes").check()  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="unknown fields"):
        Limits.from_json({"kind": "email", "rate": 1})
    with pytest.raises(InvalidInput):
        Limits.from_json(["email"])


def test_priority():
    assert [check_priority(p) for p in (0, 5, 9)] == [0, 5, 9]
    assert parse_priority("7") == 7 and parse_priority(3) == 3
    for bad in (10, -1, True, 5.0, "5", None):
        with pytest.raises(InvalidInput):
            check_priority(bad)
    for bad_text in ("10", "", "x", "\u0665", "-1"):
        with pytest.raises(InvalidInput):
            parse_priority(bad_text)


def test_key():
    assert check_key("customer-42") == "customer-42"
    assert check_key("é" * 128) == "é" * 128  # 256 bytes
    for bad in ("", "é" * 129, "a\nb", "a\x00", "\ud800", 42, None):
        with pytest.raises(InvalidInput):
            check_key(bad)


# --- the fleet split ----------------------------------------------------------------------


def test_share_is_max_min_fair():
    # A poller with a small demand is not starved by one with a backlog.
    assert share(10.0, {"a": 10_000, "b": 5}, "b") == 5.0
    assert share(10.0, {"a": 10_000, "b": 5}, "a") == 5.0
    assert share(10.0, {"a": 10_000, "b": 1_000}, "b") == 5.0
    # Spare capacity goes equally to everyone, idle pollers included.
    assert share(10.0, {"a": 2, "b": 0}, "a") == 6.0
    assert share(10.0, {"a": 2, "b": 0}, "b") == 4.0
    assert share(9.0, {"a": 0, "b": 0, "c": 0}, "c") == 3.0
    # Saturated: a poller with no demand gets nothing.
    assert share(10.0, {"a": 50, "b": 50, "c": 0}, "c") == 0.0
    assert share(10.0, {"a": 50}, "nobody") == 0.0


def test_slots_integer_split():
    assert slots(10, {"a": 100, "b": 1}, "b") == 1
    assert slots(10, {"a": 100, "b": 1}, "a") == 9
    # Fewer slots than demanding pollers: the largest demands first, ties by name.
    demands = {"a": 5, "b": 9, "c": 5, "d": 1}
    assert [slots(2, demands, p) for p in "abcd"] == [1, 1, 0, 0]
    # Spare slots go to the largest demands first.
    assert [slots(5, {"a": 1, "b": 2, "c": 0}, p) for p in "abc"] == [2, 3, 0]
    assert slots(3, {"a": 1}, "b") == 0


def test_fresh_drops_stale_and_keeps_newest():
    rows = [Demand("a", "k", 3, 0, 1000), Demand("a", "k", 7, 1, 1500), Demand("b", "k", 4, 0, 100),
            Demand("c", "k", 1, 0, 99_000), Demand("d", "j", 2, 2, 1600)]
    kept = fresh(rows, now_ms=2000, max_age_ms=1000)
    assert kept == [Demand("a", "k", 7, 1, 1500), Demand("d", "j", 2, 2, 1600)]
    assert by_kind(kept) == {"k": {"a": 7}, "j": {"d": 2}}


names = st.sampled_from([f"p{i}" for i in range(6)])
demand_maps = st.dictionaries(names, st.integers(0, 10_000), min_size=1, max_size=6)


@pytest.mark.fuzz
@given(total=st.floats(0.0001, 1e6), demands=demand_maps)
def test_shares_sum_to_at_most_total(total, demands):
    parts = [share(total, demands, p) for p in demands]
    assert all(x >= 0 for x in parts)
    assert sum(parts) <= total * (1 + 1e-9)
    if sum(demands.values()) > 0:  # everyone who asks gets at least min(ask, equal split)
        for p, d in demands.items():
            assert share(total, demands, p) >= min(d, total / len(demands)) * (1 - 1e-9)


@pytest.mark.fuzz
@given(total=st.integers(0, 200), demands=demand_maps, seed=st.integers(0, 1000))
def test_slots_sum_and_agree_across_views(total, demands, seed):
    parts = {p: slots(total, demands, p) for p in demands}
    assert sum(parts.values()) == total or total == 0
    # Every poller computes the same split whatever order its snapshot came in.
    order = list(demands.items())
    random.Random(seed).shuffle(order)
    assert {p: slots(total, dict(order), p) for p in demands} == parts
    demanding = sum(1 for d in demands.values() if d > 0)
    if 0 < total < demanding:  # the slots go to the largest demands
        given_to = [d for p, d in demands.items() if parts[p]]
        refused = [d for p, d in demands.items() if not parts[p] and d > 0]
        assert min(given_to) >= max(refused, default=0)


@pytest.mark.fuzz
@given(text=st.text(max_size=30) | st.from_regex(r"-?[0-9.e]{0,6}/[smhd]?", fullmatch=True))
def test_rate_parser_raises_only_invalid_input(text):
    try:
        rate = parse_rate(text)
    except InvalidInput as e:
        assert "\n" not in str(e)
    else:
        assert math.isfinite(rate) and rate > 0


@pytest.mark.fuzz
@given(value=st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=300),
                       st.binary(max_size=10)))
def test_checks_raise_only_invalid_input(value):
    for check in (check_key, check_priority, parse_priority,
                  lambda v: limits_from("k", rate=v), lambda v: limits_from("k", concurrency=v),
                  lambda v: limits_from(v), lambda v: Limits.from_json({"kind": "k", "burst": v})):
        with contextlib.suppress(InvalidInput):
            check(value)


# --- the gates ----------------------------------------------------------------------------


def test_gate_reasons_in_order():
    clock = FakeClock()
    gate = KindGate("email", clock)
    gate.update(Limits("email", rate_per_s=1.0, burst=1, concurrency=1))
    assert gate.try_start() is None
    assert gate.try_start() == "concurrency"  # checked before the bucket: no token spent
    gate.finished()
    assert gate.try_start() == "rate"
    clock.now = 1.0
    gate.update(Limits("email", rate_per_s=1.0, burst=1, concurrency=1, paused=True))
    assert gate.try_start() == "paused"
    gate.update(Limits("email", rate_per_s=1.0, burst=1, concurrency=1))
    assert gate.try_start() is None


def test_gate_update_mints_no_tokens():
    clock = FakeClock()
    gate = KindGate("k", clock)
    gate.update(Limits("k", rate_per_s=100.0, burst=10), rate_share=50.0)  # new: starts full, 5
    assert sum(gate.try_start() is None for _ in range(20)) == 5
    gate.update(Limits("k", rate_per_s=100.0, burst=10), rate_share=100.0)  # empty stays empty
    assert gate.try_start() == "rate"
    clock.now = 0.05  # 5 tokens at 100/s
    gate.update(Limits("k", rate_per_s=100.0, burst=10), rate_share=20.0)  # capped at burst 2
    assert sum(gate.try_start() is None for _ in range(20)) == 2
    clock.now = 0.1  # one token at 20/s, carried into a larger bucket as one
    gate.update(Limits("k", rate_per_s=100.0, burst=10), rate_share=100.0)
    assert sum(gate.try_start() is None for _ in range(20)) == 1
    gate.update(Limits("k", rate_per_s=100.0, burst=10), rate_share=0.0)
    clock.now = 10.0
    assert gate.try_start() == "rate"
    gate.update(Limits("k", rate_per_s=100.0, burst=10), rate_share=100.0)  # reopened: empty
    assert gate.try_start() == "rate"
    clock.now = 10.025
    assert sum(gate.try_start() is None for _ in range(20)) == 2


def test_gate_slots_and_clearing():
    gate = KindGate("k", FakeClock())
    gate.update(Limits("k", concurrency=10), slots=2)
    assert [gate.try_start() for _ in range(3)] == [None, None, "concurrency"]
    gate.update(Limits("k", concurrency=10), slots=3)
    assert gate.try_start() is None
    gate.update(Limits("k"))
    assert all(gate.try_start() is None for _ in range(100))
    with pytest.raises(InvalidInput):
        gate.update(Limits("other"))


def test_gates_count_running_before_limits_exist():
    gates = Gates(FakeClock())
    assert gates.try_start("k") is None and gates.try_start("k") is None
    gates.update(Limits("k", concurrency=2))
    assert gates.try_start("k") == "concurrency"
    gates.finished("k")
    assert gates.try_start("k") is None
    gates.update(Limits("k"))
    for _ in range(3):
        gates.finished("k")
    assert gates.get("k") is None  # no limits, nothing running: forgotten
    assert gates.try_start("other") is None


def test_gate_rate_over_simulated_seconds():
    """100/s with a burst of 10 for 10 s: total within 0.9-1.05 of rate x time + burst, and
    no 1 s window over rate + burst."""
    clock = FakeClock()
    gate = KindGate("k", clock)
    gate.update(Limits("k", rate_per_s=100.0, burst=10))
    starts: list[int] = []
    for ms in range(10_000):
        clock.now = ms / 1000
        while gate.try_start() is None:
            starts.append(ms)
            gate.finished()
    expected = 100 * 10 + 10
    assert 0.9 * expected <= len(starts) <= 1.05 * expected
    lo = 0
    for hi, at in enumerate(starts):
        while starts[lo] <= at - 1000:
            lo += 1
        assert hi - lo + 1 <= 110


def test_gate_rate_through_shifting_shares():
    """Two pollers whose shares change every 100 ms never exceed the fleet's rate + burst
    in any 1 s window, and a fleet with a backlog uses at least 90 % of the rate."""
    clock = FakeClock()
    limits = Limits("k", rate_per_s=50.0, burst=5)
    gates = {p: KindGate("k", clock) for p in "ab"}
    rng = random.Random(7)
    starts: list[int] = []
    for ms in range(20_000):
        clock.now = ms / 1000
        if ms % 100 == 0:
            demands = {"a": rng.randint(0, 300), "b": rng.randint(1, 300)}
            for p, gate in gates.items():
                gate.update(limits, rate_share=share(50.0, demands, p))
        for gate in gates.values():
            while gate.try_start() is None:
                starts.append(ms)
                gate.finished()
    assert len(starts) >= 0.9 * 50 * 20
    lo = 0
    for hi, at in enumerate(starts):
        while starts[lo] <= at - 1000:
            lo += 1
        assert hi - lo + 1 <= 55


# --- rate_part: the fleet's parts of a rate never sum over it, even mid-change --------


def _simulate(n: int, total: float, rounds: int, offsets_ms: list[int],
              demand_at: Callable[[str, int], int], slots: bool = False) -> list[float]:
    """Pollers refresh every 1,000 ms at their offsets: read every row, set their part
    with rate_part (slot_part with ``slots``), publish it with their demand (as
    poller/flow.py does). Returns the sum of the parts in force after each refresh."""
    names = [f"p{i}" for i in range(n)]
    rows: dict[str, Demand] = {}
    parts: dict[str, float] = dict.fromkeys(names, 0)

    def row(me: str, d: int, now: int) -> Demand:
        return (Demand(me, "k", d, 0, now, None, int(parts[me])) if slots
                else Demand(me, "k", d, 0, now, parts[me]))

    sums: list[float] = []
    events = sorted((r * 1000 + offsets_ms[i], names[i]) for r in range(rounds) for i in range(n))
    for now, me in events:
        d = demand_at(me, now)
        view = [r for p, r in rows.items() if p != me] + [row(me, d, now)]
        parts[me] = (slot_part(int(total), view, me, int(parts[me]), visible=me in rows) if slots
                     else rate_part(total, view, me, parts[me], visible=me in rows))
        rows[me] = row(me, d, now)
        sums.append(sum(parts.values()))
    return sums


@pytest.mark.parametrize("n, offsets", [(2, [100, 500]), (3, [0, 300, 700]), (3, [900, 10, 450])])
def test_a_backlog_falling_due_everywhere_at_once_never_puts_the_fleet_over(n, offsets):
    sums = _simulate(n, 200.0, 8, offsets, lambda me, now: 0 if now < 1000 else 5000)
    assert max(sums) <= 200.0 + 1e-6
    assert sums[-1] >= 0.98 * 200.0, "nearly the whole rate is used after a few rounds"


def test_one_poller_with_the_whole_backlog_gets_the_whole_rate():
    sums = _simulate(2, 200.0, 8, [100, 500], lambda me, now: 5000 if me == "p0" else 0)
    assert sums[-1] >= 0.97 * 200.0, "each round it takes half of what the idle poller left"


def test_pollers_starting_together_never_take_the_whole_rate_each():
    sums = _simulate(3, 90.0, 3, [0, 0, 0], lambda me, now: 1000)
    assert max(sums) <= 90.0 + 1e-6
    assert sums[2] == 0.0, "no part is raised before the others have seen it"


def test_a_part_falls_at_once_and_rises_only_into_what_the_others_leave():
    rows = [Demand("a", "k", 100, 0, 0, 150.0), Demand("b", "k", 100, 0, 0, 50.0)]
    assert rate_part(200.0, rows, "a", 150.0) == pytest.approx(100.0), "down to its fair share at once"
    assert rate_part(200.0, rows, "b", 50.0) == pytest.approx(50.0), "a's 150 leaves b nothing more yet"
    # B's demand jumps while A's part is still at its old level: both raise at most their
    # cut of the same free room (the case that summed to 145 of 100 with cuts shared only
    # among the pollers that seemed to want more).
    seen_a = [Demand("a", "k", 100, 0, 0, 50.0), Demand("b", "k", 5, 0, 0, 5.0)]
    seen_b = [Demand("a", "k", 100, 0, 0, 50.0), Demand("b", "k", 1000, 0, 0, 5.0)]
    assert rate_part(100.0, seen_a, "a", 50.0) + rate_part(100.0, seen_b, "b", 5.0) <= 100.0


@pytest.mark.fuzz
@given(st.integers(1, 4), st.lists(st.integers(0, 999), min_size=4, max_size=4),
       st.lists(st.integers(0, 3000), min_size=12, max_size=12))
def test_the_parts_never_sum_over_the_rate_whatever_the_demands(n, offsets, steps):
    def demand(me: str, now: int) -> int:
        return int(steps[(int(me[1:]) * 3 + now // 1000) % len(steps)])
    sums = _simulate(n, 100.0, 5, offsets[:n], demand)
    assert max(sums) <= 100.0 + 1e-6


# --- slot_part: the same for a concurrency, in whole slots ------------------------------


@pytest.mark.parametrize("n, offsets", [(2, [100, 500]), (3, [0, 300, 700]), (3, [0, 0, 0])])
def test_demand_appearing_everywhere_in_one_round_never_puts_the_slots_over(n, offsets):
    sums = _simulate(n, 10, 8, offsets, lambda me, now: 0 if now < 1000 else 50, slots=True)
    assert max(sums) <= 10
    assert sums[-1] == 10, "every slot is in use after a few rounds"


def test_a_lone_free_slot_goes_to_one_poller_and_is_not_stuck():
    sums = _simulate(2, 1, 4, [0, 0], lambda me, now: 5, slots=True)
    assert max(sums) <= 1 and sums[-1] == 1


def test_slots_fall_at_once_and_rise_only_into_what_the_others_leave():
    rows = [Demand("a", "k", 10, 0, 0, None, 8), Demand("b", "k", 10, 0, 0, None, 2)]
    assert slot_part(10, rows, "a", 8) == 5, "down to its fair share at once"
    assert slot_part(10, rows, "b", 2) == 2, "a's 8 leaves b nothing more yet"


@pytest.mark.fuzz
@given(st.integers(1, 4), st.integers(1, 12), st.lists(st.integers(0, 999), min_size=4, max_size=4),
       st.lists(st.integers(0, 30), min_size=12, max_size=12))
def test_the_slots_never_sum_over_the_limit_whatever_the_demands(n, total, offsets, steps):
    def demand(me: str, now: int) -> int:
        return int(steps[(int(me[1:]) * 3 + now // 1000) % len(steps)])
    sums = _simulate(n, total, 5, offsets[:n], demand, slots=True)
    assert max(sums) <= total


@pytest.mark.parametrize("text, said", [
    ("-1", "burst -1 must be at least 1"), ("0", "burst 0 must be at least 1"),
    ("9" * 40, "is above the highest, 1000000000"), ("1000000001", "is above the highest"),
    ("abc", "is not a whole number"), ("1.5", "is not a whole number")])
def test_a_bad_count_says_what_is_wrong_with_it(text, said):
    with pytest.raises(InvalidInput, match=re.escape(said)) as err:
        parse_count("burst", text)
    assert "limits clear" in str(err.value) or "whole number" in str(err.value)


def test_a_count_may_have_a_sign_or_leading_zeros():
    assert [parse_count("burst", t) for t in ("+3", "03", " 3 ")] == [3, 3, 3]


# --- may_raise: slow rounds and fast ones never put the parts over ----------------------


def _interleaved(seed: int, slow_s: float, split: Callable[..., float], total: float) -> float:
    """Three pollers with read and publish as separate events (a round that is slow now
    and then, a quick second round while a part waits to be seen, restarts, demand
    jumping), each raising only when ``may_raise`` allows it. Returns the largest sum of
    the parts in force."""
    rnd = random.Random(seed)
    names = ["a", "b", "c"]
    pub: dict[str, Demand] = {}
    inforce = dict.fromkeys(names, 0.0)
    raised: dict[str, int] = {}
    first: dict[str, int] = {}
    demand = {p: rnd.choice([0, 5, 1000]) for p in names}
    events = [(rnd.random(), p, "read") for p in names]
    heapq.heapify(events)
    views: dict[str, tuple[int, dict[str, Demand]]] = {}
    worst = 0.0
    while events:
        t, p, what = heapq.heappop(events)
        if t > 120:
            break
        now = int(t * 1000)
        if rnd.random() < 0.05:
            demand[rnd.choice(names)] = rnd.choice([0, 5, 1000])
        if what == "read":
            if rnd.random() < 0.01:  # restarted: its row is gone, it holds nothing
                pub.pop(p, None)
                inforce[p] = 0.0
                raised.pop(p, None)
                first.pop(p, None)
            views[p] = (now, dict(pub))
            heapq.heappush(events, (t + (slow_s if rnd.random() < 0.2 else 0.01), p, "publish"))
            continue
        read_at, view = views[p]
        others = [r for q, r in view.items() if q != p]
        rows = [*others, Demand(p, "k", demand[p], 0, read_at, inforce[p], int(inforce[p]))]
        ok = may_raise(others, p in view, raised.get(p), 0, first.get(p), read_at)
        if now - read_at > SETTLE_MS:
            ok = False  # a slow round raises nothing
        mine = view.get(p)
        extra = {} if split is rate_part else {"published": None if mine is None else mine.demand}
        new = float(split(total, rows, p, type(total)(inforce[p]), ok, **extra))
        if new > inforce[p] or p not in pub:
            raised[p] = now
        first.setdefault(p, now)
        pub[p] = Demand(p, "k", demand[p], 0, read_at, new, int(new))
        inforce[p] = new
        worst = max(worst, sum(inforce.values()))
        heapq.heappush(events, (t + (0.1 if p not in view else 1.0), p, "read"))
    return worst


@pytest.mark.parametrize("slow_s", [0.15, 0.6, 1.2, 2.5])
def test_slow_and_quick_rounds_never_put_the_rate_parts_over(slow_s):
    assert max(_interleaved(seed, slow_s, rate_part, 100.0) for seed in range(60)) <= 100.0 + 1e-6


@pytest.mark.parametrize("slow_s", [0.15, 1.2])
def test_slow_and_quick_rounds_never_put_the_slots_over(slow_s):
    assert max(_interleaved(seed, slow_s, slot_part, 10) for seed in range(60)) <= 10


def test_a_raise_waits_for_the_others_to_read_after_the_last_one():
    others = [Demand("b", "k", 5, 0, 2_000), Demand("c", "k", 5, 0, 2_600)]
    assert not may_raise(others, True, 1_800, 500), "b read before my raise was surely seen"
    assert may_raise(others, True, 1_400, 500)
    assert not may_raise(others, False, 1_400, 500), "my own row not seen yet"
    assert not may_raise(others, True, None, 500), "never published"
    assert may_raise([], True, 1_400, 500), "alone: nobody to wait for"
