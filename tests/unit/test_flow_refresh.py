"""A poller's flow refresh against a store in memory: a part is raised only once the
others have seen this poller, and none is held once they may have stopped counting it."""

from __future__ import annotations

from typing import Any

from scheduler.domain.clock import FakeClock
from scheduler.domain.flow import SETTLE_MS, Demand, Limits
from scheduler.domain.model import Job
from scheduler.errors import StoreUnavailable
from scheduler.observe.metrics import PollerMetrics
from scheduler.poller.config import PollerConfig
from scheduler.poller.flow import DEMAND_MAX_AGE_MS, SETTLE_S, FlowControl
from scheduler.poller.shared import Core
from tests.unit.test_poller_roles import META, FakeStore


class FlowStore(FakeStore):
    def __init__(self) -> None:
        super().__init__()
        self.limits = [Limits("k", rate_per_s=100.0)]
        self.demand_rows: dict[tuple[str, str], Demand] = {}
        self.failing = False
        self.on_publish: Any = None  # called inside publish_demand (a slow store, a probe)

    def flow_limits(self) -> list[Any]:
        return list(self.limits)

    def publish_demand(self, poller: str, entries: Any, now_ms: int) -> None:
        if self.failing:
            raise StoreUnavailable("the demand table is unreachable")
        if self.on_publish is not None:
            self.on_publish()
        for kind, demand, running, part, slots in entries:
            self.demand_rows[(poller, kind)] = Demand(poller, kind, demand, running, now_ms, part, slots)

    def demands(self, now_ms: int, max_age_ms: int) -> list[Demand]:
        if self.failing:
            raise StoreUnavailable("the demand table is unreachable")
        return [r for r in self.demand_rows.values() if abs(now_ms - r.at_ms) <= max_age_ms]


def test_a_part_grows_only_once_seen_and_is_dropped_when_it_can_no_longer_be_published():
    store, clock = FlowStore(), FakeClock()
    core = Core(store, clock, PollerConfig(), "me", PollerMetrics(), META)  # type: ignore[arg-type]
    flow = FlowControl(core)
    flow.refresh()
    gate = core.due.gates.get("k")
    assert gate is not None and gate.rate_share == 0, "not seen yet by the others: no part"
    clock.advance(1.0)
    flow.refresh()
    assert gate.rate_share == 100.0, "alone and seen: the whole rate"
    store.failing = True
    # Its last row was written from the read at this instant; the others drop it once it
    # is DEMAND_MAX_AGE_MS old by their clocks, which may run 2 x skew ahead of its own.
    life = (DEMAND_MAX_AGE_MS - 2 * META.max_skew_ms) / 1000
    clock.advance(life - 0.05)
    flow.refresh()
    assert gate.rate_share == 100.0, "its rows are still fresh: the others still count them"
    assert core.due.parts_until > clock.monotonic()
    clock.advance(0.1)
    assert core.due.parts_until < clock.monotonic(), "the dispatcher stops it even before a round"
    flow.refresh()
    assert gate.rate_share == 0, "the others may have dropped its rows: it holds no part"
    store.failing = False
    flow.refresh()
    assert gate.rate_share == 0, "back: it starts over, as a poller that just started"
    assert flow.settling


def _seen_alone(rate: float = 100.0) -> tuple[FlowStore, FakeClock, Core, FlowControl]:
    store, clock = FlowStore(), FakeClock()
    store.limits = [Limits("k", rate_per_s=rate)]
    core = Core(store, clock, PollerConfig(), "me", PollerMetrics(), META)  # type: ignore[arg-type]
    flow = FlowControl(core)
    flow.refresh()
    clock.advance(1.0)
    flow.refresh()
    gate = core.due.gates.get("k")
    assert gate is not None and gate.rate_share == rate
    return store, clock, core, flow


def test_a_publish_that_lands_after_the_rows_went_stale_holds_no_part():
    """A store call so slow that, when the publish lands, the others may already have
    dropped the previous row and taken the part: the part computed from it is void."""
    store, clock, core, flow = _seen_alone()
    store.on_publish = lambda: clock.advance(DEMAND_MAX_AGE_MS / 1000)
    flow.refresh()
    gate = core.due.gates.get("k")
    assert gate is not None and gate.rate_share == 0
    store.on_publish = None
    flow.refresh()
    assert gate.rate_share == 0, "it starts over: seen again first"


def test_a_slow_publish_does_not_make_its_row_look_younger():
    """The deadline counts from the read that preceded the publish (the row's time), not
    from when a slow publish returned."""
    store, clock, core, flow = _seen_alone()
    store.on_publish = lambda: clock.advance(0.5)
    start = clock.monotonic()
    flow.refresh()
    life = (DEMAND_MAX_AGE_MS - 2 * META.max_skew_ms) / 1000
    assert core.due.parts_until == start + life


def test_a_lowered_part_is_in_force_before_it_is_published():
    """Another poller may read the lowered part and take the room at once: the lowering
    must already hold here by then."""
    store, clock, core, flow = _seen_alone()
    store.demand_rows[("other", "k")] = Demand("other", "k", 1000, 0, clock.now_ms(), 0.0, None)
    gate = core.due.gates.get("k")
    assert gate is not None
    in_force: list[float | None] = []
    store.on_publish = lambda: in_force.append(gate.rate_share)
    clock.advance(1.0)
    store.demand_rows[("other", "k")] = store.demand_rows[("other", "k")]._replace(at_ms=clock.now_ms())
    flow.refresh()
    # Idle here, busy there: the whole rate goes to the other poller.
    assert in_force == [0.0] and gate.rate_share == 0.0


def test_a_part_waiting_to_be_seen_keeps_its_kinds_jobs_and_is_raised_soon():
    """A poller starting (or a limit just set) holds no part until the others have seen
    its row and SETTLE_MS have passed: its kind's jobs are refused for that moment, which
    must not place the backlog later (a minute of churn), and rounds come every SETTLE_S
    meanwhile, not every second."""
    store, clock = FlowStore(), FakeClock()
    store.limits = [Limits("k", concurrency=10)]
    core = Core(store, clock, PollerConfig(), "me", PollerMetrics(), META)  # type: ignore[arg-type]
    flow = FlowControl(core)
    flow.refresh()
    assert flow.settling and core.due.settling == {"k"}
    for i in range(500):
        core.due.push(Job(f"j{i:03d}", "k", b"", False, 100, 100, 0, 0))
    with core.cond:
        assert core.due.pop_ready(1000, 100) == [], "no slots yet"
        assert core.due.excess(1000) == [], "refused while settling: kept, not placed later"
    rounds = 0
    while flow.settling:  # seen, then SETTLE_MS after its first publish: rounds 0.1 s apart
        clock.advance(SETTLE_S)
        flow.refresh()
        rounds += 1
    assert rounds == SETTLE_MS // 250 and core.due.settling == set()
    with core.cond:
        assert len(core.due.pop_ready(1000, 100)) == 10
