"""The poller's two-stage queue (due queue, then the fair stage behind the kinds' gates),
pure, on a fake clock."""

from __future__ import annotations

from scheduler.domain.clock import FakeClock
from scheduler.domain.flow import Limits
from scheduler.domain.model import Job
from scheduler.poller.duequeue import DueQueue
from scheduler.poller.flowqueue import HOLD_S, KEEP_MIN, FlowQueue


def job(job_id: str, due_ms: int, kind: str = "k", key: str | None = None, priority: int = 5,
        shard: int = 0) -> Job:
    return Job(job_id=job_id, kind=kind, data=b"", data_json=False, due_ms=due_ms, fire_ms=due_ms,
               bucket=0, shard=shard, key=key, priority=priority)


def queue() -> tuple[FlowQueue, FakeClock]:
    clock = FakeClock()
    return FlowQueue(DueQueue(monotonic=clock.monotonic), clock.monotonic), clock


def test_no_limits_behaves_as_the_due_queue_but_by_priority():
    q, _ = queue()
    q.push(job("low", 100, priority=1))
    q.push(job("high", 200, priority=9))
    q.push(job("later", 5000, priority=9))
    assert [j.job_id for j in q.pop_ready(1000, 10)] == ["high", "low"]
    assert len(q) == 1, "never before its due time"
    assert q.pop_ready(1000, 10) == []


def test_a_rate_limited_kind_does_not_hold_back_another_kind():
    q, clock = queue()
    q.set_limits(Limits("slow", rate_per_s=1.0, burst=1), 1.0, None)
    for i in range(5):
        q.push(job(f"s{i}", 100, kind="slow"))
    q.push(job("f", 200, kind="fast"))
    first = [j.job_id for j in q.pop_ready(1000, 10)]
    assert first == ["s0", "f"]
    assert q.pop_ready(1000, 10) == []
    clock.advance(1.0)
    assert [j.job_id for j in q.pop_ready(2000, 10)] == ["s1"]
    assert q.fair.throttled[("slow", "rate")] >= 1


def test_a_paused_kind_has_all_its_due_jobs_placed_ahead_oldest_first():
    q, _ = queue()
    q.set_limits(Limits("p", paused=True), None, None)
    for i in range(3):
        q.push(job(f"p{i}", 100 + i, kind="p"))
    q.push(job("other", 100))
    assert [j.job_id for j in q.pop_ready(1000, 10)] == ["other"]
    out = q.excess(1000)
    assert [(j.job_id, why.split(":")[0]) for j, _, why in out] == [("p0", "held"), ("p1", "held"),
                                                                   ("p2", "held")]
    ats = [at for _, at, _ in out]
    assert ats == sorted(ats) and ats[0] >= 1000 + HOLD_S * 1000, "placed ahead, in due order"
    assert len(q) == 0 and q.held("p") == 3


def test_a_throttled_kind_keeps_what_it_starts_soon_and_places_the_rest_at_its_rate():
    q, _ = queue()
    q.set_limits(Limits("t", rate_per_s=10.0, burst=1), 10.0, None)
    n = 3 * KEEP_MIN + 10
    for i in range(n):
        q.push(job(f"t{i:04d}", 100 + i, kind="t"))
    q.pop_ready(1000, 100)  # one starts (the burst), the rest are refused
    out = q.excess(1000)
    keep = max(KEEP_MIN, 10 * 5)
    assert len(out) == n - 1 - keep
    assert all(at > 1000 for _, at, _ in out), "never earlier"
    kept = {j.job_id for j in q.fair.jobs()}
    assert kept == {f"t{i:04d}" for i in range(1, 1 + keep)}, "the oldest stay"
    assert q.excess(1000) == [], "nothing more while it is not refused again"


def test_an_unthrottled_kind_keeps_its_backlog():
    q, _ = queue()
    q.set_limits(Limits("c", concurrency=1000), None, 1000)
    for i in range(500):
        q.push(job(f"c{i}", 100, kind="c"))
    q.pop_ready(1000, 0)  # no room: nothing starts, nothing is refused by a gate
    assert q.excess(1000) == []


def test_finished_frees_a_slot_only_for_admitted_jobs():
    q, _ = queue()
    q.set_limits(Limits("c", concurrency=1), None, 1)
    a, b = job("a", 100, kind="c"), job("b", 100, kind="c")
    q.push(a)
    q.push(b)
    assert [j.job_id for j in q.pop_ready(1000, 10)] == ["a"]
    q.finished(b)  # never admitted: ignored
    assert q.pop_ready(1000, 10) == []
    q.finished(a)
    assert [j.job_id for j in q.pop_ready(1000, 10)] == ["b"]


def test_find_and_discard_see_jobs_in_either_stage():
    q, _ = queue()
    q.set_limits(Limits("p", paused=True), None, None)
    q.push(job("waiting", 100, kind="p", shard=1))
    q.push(job("future", 9000, shard=1))
    q.pop_ready(1000, 10)  # "waiting" moves to the fair stage
    keys = {(100, "waiting"), (9000, "future")}
    assert set(q.find(keys)) == keys
    assert q.find({(101, "waiting")}) == {}, "matched on the fire time too"
    assert {j.job_id for j in q.discard_shard(1)} == {"waiting", "future"}
    assert len(q) == 0


def test_per_key_fairness_a_small_key_is_not_starved():
    q, _ = queue()
    q.set_limits(Limits("k", per_key_concurrency=1), None, None)
    for i in range(100):
        q.push(job(f"big{i:03d}", 100, key="big"))
    q.push(job("small0", 150, key="small"))
    started = [j.job_id for j in q.pop_ready(1000, 10)]
    assert started == ["big000", "small0"], "one of each key, then both keys are at their limit"


def test_a_key_at_its_limit_has_its_excess_placed_later_not_the_small_key():
    q, _ = queue()
    q.set_limits(Limits("k", per_key_concurrency=1), None, None)
    for i in range(400):
        q.push(job(f"big{i:03d}", 100 + i, key="big"))
    q.push(job("small", 600, key="small"))
    q.pop_ready(1000, 10)
    out = q.excess(1000)
    assert out and all(j.key == "big" for j, _, _ in out), "the big key's newest go, the small key stays"
    assert "small" not in {j.job_id for j, _, _ in out}


def test_two_rows_of_one_job_are_two_entries_each_completed_on_its_own():
    q, _ = queue()
    q.set_limits(Limits("c", concurrency=5), None, 5)
    old, new = job("j", 100, kind="c"), job("j", 200, kind="c")
    q.push(old)
    q.push(new)
    assert len(q) == 2, "a reschedule's new row does not replace the old one"
    taken = q.pop_ready(1000, 10)
    assert [(j.fire_ms, j.job_id) for j in taken] == [(100, "j"), (200, "j")]
    gate = q.gates.get("c")
    assert gate is not None and gate.running == 2
    for j in taken:
        q.finished(j)
    assert gate.running == 0, "each row frees its own slot"


def test_a_stored_rate_at_the_floor_places_the_excess_at_most_a_minute_ahead():
    q, _ = queue()
    q.set_limits(Limits("t", rate_per_s=1 / 86_400, burst=1), 1 / 86_400, None)
    for i in range(200):
        q.push(job(f"t{i:03d}", 100, kind="t"))
    q.pop_ready(1000, 10)
    out = q.excess(1000)
    assert out and max(at for _, at, _ in out) <= 1000 + 60_000


def test_a_recalled_row_deferred_again_is_placed_after_its_row_never_at_or_before_it():
    """A recalled row sits ahead of its due time; deferred again, it goes after its own
    position. At it, the placement would rewrite the row the progress marks complete."""
    q, _ = queue()
    q.set_limits(Limits("k", per_key_concurrency=1), None, None)
    for i in range(400):
        # As ``take_early`` queues a recalled row: at its due time, its row far ahead.
        q.push(job(f"r{i:03d}", 100, key="big").evolve(fire_ms=90_000 + i), at_ms=100)
    q.pop_ready(1000, 10)
    out = q.excess(1000)
    assert out and all(at > j.fire_ms for j, at, _ in out)


def test_rows_placed_later_are_recalled_once_their_kind_can_start_them_not_while_paused():
    q, _ = queue()
    q.set_limits(Limits("p", paused=True), None, None)
    placed = [job(f"p{i}", 100 + i, kind="p").evolve(fire_ms=50_000 + i) for i in range(3)]
    q.placed(placed)
    assert q.recall(1000) == [], "paused: they stay where they were placed"
    q.set_limits(Limits("p"), None, None)  # resumed, no limits left
    assert q.recall(1000) == placed, "oldest first, all of them: nothing holds the kind back"
    assert q.recall(1000) == [], "forgotten once recalled"
    q.placed(placed)
    assert q.recall(60_000) == [], "rows whose time has passed came back by themselves"


def test_a_raised_rate_recalls_what_the_kind_can_start_soon():
    q, _ = queue()
    q.set_limits(Limits("t", rate_per_s=20.0), 20.0, None)
    q.placed([job(f"t{i:04d}", 100, kind="t").evolve(fire_ms=90_000 + i) for i in range(1000)])
    got = q.recall(1000)
    assert len(got) == max(KEEP_MIN, 20 * 5), "its queue filled to what it starts in the horizon"


def test_due_jobs_reach_the_fair_stage_even_with_no_room_to_start_any():
    q, _ = queue()
    q.set_limits(Limits("p", paused=True), None, None)
    q.push(job("p0", 100, kind="p"))
    assert q.pop_ready(1000, 0) == []
    assert q.fair.waiting_kinds() == {"p": 1}, "a paused kind is held while the flight is full"
    assert [j.job_id for j, _, _ in q.excess(1000)] == ["p0"]


def test_a_row_admitted_twice_frees_its_slot_twice():
    q, _ = queue()
    q.set_limits(Limits("c", concurrency=5), None, 5)
    row = job("j", 100, kind="c")
    q.push(row)
    assert q.pop_ready(1000, 10) == [row]
    q.push(row)  # read again (its shard lost and claimed again) while the first run goes on
    assert q.pop_ready(1000, 10) == [row]
    gate = q.gates.get("c")
    assert gate is not None and gate.running == 2
    q.finished(row)
    q.finished(row)
    assert gate.running == 0


def test_jobs_placed_later_give_back_the_pollers_rate_tokens():
    """Under ``--max-rate``, a throttled kind's excess took tokens on its way to the fair
    stage; placed later, it gives them back, so another kind is not starved by jobs that
    never started."""
    clock = FakeClock()
    # A burst of 300 tokens (a tenth of a second at 3,000/s); the clock stands still.
    q = FlowQueue(DueQueue(poller_rate=3000.0, monotonic=clock.monotonic), clock.monotonic)
    q.set_limits(Limits("slow", rate_per_s=1.0, burst=1), 1.0, None)
    for i in range(250):
        q.push(job(f"s{i:03d}", 100, kind="slow"))
    started = q.pop_ready(1000, 1000)
    assert [j.job_id for j in started] == ["s000"], "one token of its own rate"
    placed = q.excess(1000)
    assert len(placed) == 250 - 1 - KEEP_MIN
    for i in range(150):
        q.push(job(f"f{i:03d}", 100, kind="fast"))
    # 50 tokens were left; the 199 placed jobs gave theirs back.
    assert len(q.pop_ready(1000, 1000)) == 150


def test_many_throttled_kinds_share_one_budget_of_kept_jobs():
    """Each throttled kind may keep some jobs; ten of them together must not fill the
    read buffer (a quarter of it at most), or they block every other kind again."""
    clock = FakeClock()
    q = FlowQueue(DueQueue(monotonic=clock.monotonic), clock.monotonic, max_buffered=800)
    kinds = [f"k{n}" for n in range(10)]
    for kind in kinds:
        q.set_limits(Limits(kind, rate_per_s=1.0, burst=1), 1.0, None)
        for i in range(60):
            q.push(job(f"{kind}-{i:02d}", 100, kind=kind))
    q.pop_ready(1000, 1000)  # one of each starts; the rest are refused by their gates
    q.excess(1000)
    kept = sum(q.fair.waiting_kinds().values())
    assert kept <= 800 // 4, kept


def test_a_key_spelled_none_next_to_keyless_jobs_is_placed_without_a_crash():
    q, _ = queue()
    q.set_limits(Limits("p", paused=True), None, None)
    for i in range(3):
        q.push(job(f"a{i}", 100 + i, kind="p", key="None"))
        q.push(job(f"b{i}", 100 + i, kind="p"))
    q.pop_ready(10_000, 10)
    assert len(q.excess(10_000)) == 6


def test_a_large_paused_backlog_is_held_oldest_first_across_passes():
    q, _ = queue()
    q.set_limits(Limits("p", paused=True), None, None)
    for i in range(5000):
        q.push(job(f"p{i:04d}", 100 + i, kind="p", priority=i % 10))
    q.pop_ready(10_000, 10)
    placed = q.excess(10_000) + q.excess(10_000) + q.excess(10_000)
    order = [j.job_id for j, _at, _why in sorted(placed, key=lambda p: p[1])]
    assert order == [f"p{i:04d}" for i in range(5000)]


def test_parts_past_their_deadline_start_nothing_of_a_limited_kind():
    """Flow control stuck in a store call cannot publish: once the others may have taken
    this poller's parts, its limited kinds start nothing (checked here, by the dispatcher,
    not by the stuck thread); kinds without a limit go on."""
    q, clock = queue()
    q.set_limits(Limits("lim", rate_per_s=100.0, burst=100), 100.0, None)
    q.parts_until = clock.monotonic() + 2.0
    q.push(job("a", 100, kind="lim"))
    assert [j.job_id for j in q.pop_ready(1000, 10)] == ["a"]
    clock.advance(2.5)
    q.push(job("b", 100, kind="lim"))
    q.push(job("c", 100, kind="free"))
    assert [j.job_id for j in q.pop_ready(1000, 10)] == ["c"]
    assert q.fair.throttled[("lim", "rate")] >= 1
