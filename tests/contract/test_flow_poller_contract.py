"""Flow control in live pollers (real threads, the system clock), on both stores: a kind's
rate with a backlog, without holding up other kinds; three pollers sharing a rate;
per-key concurrency and turns between keys; priorities; pause and resume; a limit
changed live; a kind's concurrency.

Every bound is read from the handlers' own start and end times: starts in any one-second
window, intervals running at once, the order of starts. The waits are for states (so
many started, this one fired), never a fixed sleep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import pytest

from scheduler import App, Client, Job, JobSpec
from scheduler.domain.clock import SystemClock
from scheduler.domain.keys import from_ms, shard_of
from scheduler.poller import Poller, PollerConfig, flowqueue
from scheduler.store import SchemaOptions, Store
from tests.conftest import make_store
from tests.procs import wait_until

SHARDS = 4
# Jobs are written this far ahead of their due time: past the late margin (3 s), with
# time for the inserts (``write`` checks that no job was moved for being late).
LEAD_MS = 5000


@pytest.fixture
def fstore(store_kind: str, request: Any, tmp_path: Any) -> Iterator[Store]:
    st = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=SHARDS))
    yield st
    st.close()


def now_ms() -> int:
    return SystemClock().now_ms()


class Run(NamedTuple):
    job_id: str
    kind: str
    key: str | None
    priority: int
    due_ms: int
    start_ms: float
    end_ms: float


class Runs:
    """A handler for every kind that records each call (start and end, wall clock in ms,
    as due times are) and sleeps ``sleep_s[kind]`` between them."""

    def __init__(self, sleep_s: dict[str, float] | None = None) -> None:
        self.sleep_s = sleep_s or {}
        self._lock = threading.Lock()
        self.runs: list[Run] = []
        self.started: dict[str, int] = {}

    def __call__(self, job: Job) -> None:
        start = time.time() * 1000
        with self._lock:
            self.started[job.kind] = self.started.get(job.kind, 0) + 1
        time.sleep(self.sleep_s.get(job.kind, 0.0))
        run = Run(job.job_id, job.kind, job.key, job.priority, job.due_ms, start, time.time() * 1000)
        with self._lock:
            self.runs.append(run)

    def of(self, kind: str, key: str | None = None) -> list[Run]:
        """The finished runs of ``kind`` (and ``key``), by start time."""
        with self._lock:
            runs = [r for r in self.runs if r.kind == kind and (key is None or r.key == key)]
        return sorted(runs, key=lambda r: r.start_ms)

    def count(self, kind: str) -> int:
        with self._lock:
            return self.started.get(kind, 0)


@contextmanager
def polling(store: Store, runs: Runs, **config: Any) -> Iterator[Poller]:
    """One poller owning every shard, its threads running, stopped at the end."""
    with pollers(store, runs, [range(SHARDS)], **config) as [poller]:
        yield poller


@contextmanager
def pollers(store: Store, runs: Runs, shards: list[range], **config: Any) -> Iterator[list[Poller]]:
    """A fleet in one process: a poller for each group of shards, all on one store."""
    started: list[Poller] = []
    try:
        for i, group in enumerate(shards):
            poller = Poller(store, App.for_function(runs), config=PollerConfig(check_clock=False, **config),
                            name=f"p{i}")
            poller.start(group, epoch=1)
            started.append(poller)
        yield started
    finally:
        for poller in started:
            poller.stop(timeout_s=10)


def write(store: Store, jobs: list[JobSpec]) -> None:
    """Schedule ``jobs``; each must keep its due time as its fire time (written ahead of
    the late margin), or the order and lateness the tests read would mean nothing."""
    moved = [j.job_id for j in Client(store).schedule_many(jobs) if j.fire_ms != j.due_ms]
    assert not moved, f"written too late, moved: {moved[:5]}"


def specs(prefix: str, n: int, due_ms: int, kind: str, step_ms: int = 0, **extra: Any) -> list[JobSpec]:
    return [JobSpec(f"{prefix}{i:04d}", from_ms(due_ms + i * step_ms), kind, **extra) for i in range(n)]


def max_in_window(starts: list[float], width_ms: float = 1000) -> int:
    """The most starts in any window [t, t + width) (t a start: the worst window starts at one)."""
    starts = sorted(starts)
    best, lo = 0, 0
    for hi, t in enumerate(starts):
        while starts[lo] <= t - width_ms:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def max_overlap(runs: list[Run]) -> int:
    """The most runs in progress at once (an end at the same instant as a start comes first)."""
    events = sorted([(r.start_ms, 1) for r in runs] + [(r.end_ms, -1) for r in runs],
                    key=lambda e: (e[0], e[1]))
    best = cur = 0
    for _, step in events:
        cur += step
        best = max(best, cur)
    return best


def in_span(runs: list[Run], lo_ms: float, hi_ms: float) -> int:
    return sum(1 for r in runs if lo_ms <= r.start_ms < hi_ms)


def backlog_beside(store: Store, limit: str, max_buffered: int, timeout_s: float,
                   sleep_s: float = 0.0) -> Runs:
    """400 jobs of kind ``slow`` (limited by the caller, 10 a second at most) due at once,
    and 40 of the unlimited kind ``fast`` due at the same instant but after them in the
    store's order. The read buffer holds ``max_buffered`` rows: unless the slow kind's
    excess is placed later, the fast kind waits behind its backlog (40 s of it).
    Returns once every fast job ran and 80 slow ones started."""
    t0 = now_ms() + LEAD_MS
    key = "big" if limit == "key" else None
    write(store, specs("s", 400, t0, "slow", key=key) + specs("zf", 40, t0, "fast"))
    runs = Runs({"slow": sleep_s})
    with polling(store, runs, max_buffered=max_buffered, read_limit=50):
        wait_until(lambda: len(runs.of("fast")) == 40 and runs.count("slow") >= 80, timeout_s,
                   "every fast job and 80 slow ones")
    return runs


def test_a_rate_limited_backlog_stays_in_its_rate_and_holds_up_no_other_kind(fstore):
    """A read buffer of 100 holds no more than twice what the kind keeps queued at its
    rate (5 s of starts, at least 50)."""
    rate, burst = 10.0, 5
    fstore.set_limits("slow", rate, burst, None, None, now_ms())
    runs = backlog_beside(fstore, "rate", max_buffered=100, timeout_s=60)
    slow, fast = runs.of("slow"), runs.of("fast")
    starts = [r.start_ms for r in slow]
    assert max_in_window(starts) <= rate + burst, "a second with more starts than rate + burst"
    # Over the backlog (past the first burst), at least 0.7 of the rate.
    first, last = starts[0], starts[-1]
    assert len(starts) - burst >= 0.7 * rate * (last - first) / 1000, (len(starts), last - first)
    assert in_span(slow, 0, fast[-1].start_ms) < 100, "the fast kind waited behind the backlog"
    assert all(r.start_ms >= r.due_ms for r in fast + slow), "started before due"


def test_a_per_key_backlog_holds_up_no_other_kind(fstore):
    """One key's 400 jobs at per-key concurrency 1 (0.1 s each: 40 s of them) never reach
    the kind's gate, yet their excess is placed later too: the fast kind does not wait."""
    fstore.set_limits("slow", None, None, None, 1, now_ms())
    runs = backlog_beside(fstore, "key", max_buffered=100, timeout_s=60, sleep_s=0.1)
    slow, fast = runs.of("slow"), runs.of("fast")
    assert max_overlap(slow) == 1
    assert in_span(slow, 0, fast[-1].start_ms) < 100, "the fast kind waited behind the key's backlog"


def test_pollers_sharing_a_rate_stay_within_it_when_a_backlog_falls_due(fstore):
    """Three pollers in one process share 20/s (burst 10); 300 jobs fall due on all of them
    at once, when each one's last published demand is 0. No second has more starts than
    rate + burst, and together they keep at least 0.6 of the rate."""
    rate, burst = 20.0, 10
    fstore.set_limits("shared", rate, burst, None, None, now_ms())
    write(fstore, specs("s", 300, now_ms() + LEAD_MS, "shared"))
    runs = Runs()
    with pollers(fstore, runs, [range(0, 2), range(2, 3), range(3, 4)]):
        wait_until(lambda: runs.count("shared") >= 150, 60, "150 started")
    starts = [r.start_ms for r in runs.of("shared")]
    worst = max_in_window(starts)
    assert worst <= rate + burst, f"{worst} starts in one second (limit {rate:g}/s + {burst})"
    span = starts[-1] - starts[0]
    assert len(starts) - burst >= 0.6 * rate * span / 1000, (len(starts), span)


def test_per_key_concurrency_and_turns_between_keys(fstore):
    """Per-key concurrency 2, handlers of 0.2 s. A key with 500 due jobs and a key with 5
    due just after them: the small key takes turns with the large one instead of waiting
    behind its backlog (50 s of it)."""
    k = 2
    fstore.set_limits("keyed", None, None, None, k, now_ms())
    t0 = now_ms() + LEAD_MS
    write(fstore, specs("big", 500, t0, "keyed", key="big")
          + specs("small", 5, t0 + 100, "keyed", key="small"))
    runs = Runs({"keyed": 0.2})
    with polling(fstore, runs):
        wait_until(lambda: len(runs.of("keyed", "small")) == 5 and len(runs.of("keyed", "big")) >= 30,
                   60, "the small key's 5 jobs and 30 of the big key's")
    big, small = runs.of("keyed", "big"), runs.of("keyed", "small")
    assert max_overlap(big) == k, f"the big key ran {max_overlap(big)} at once (limit {k})"
    assert max_overlap(small) <= k
    assert max_overlap(big + small) > k, "the limit is per key, not per kind"
    assert in_span(big, 0, small[-1].start_ms) < 250, "the small key waited behind the big key's backlog"


def priorities_in_start_order(store: Store, warm_up: bool) -> list[int]:
    """One worker; 20 jobs of priority 1 and 20 of priority 9, all due at the same instant,
    the priority 1 ones first in the store's order. With ``warm_up``, a slow job of another
    kind runs first (the workers then take due jobs one by one, not in chunks)."""
    t0 = now_ms() + LEAD_MS
    warm = specs("warm", 1, t0 - 1000, "warm") if warm_up else []
    write(store, warm + specs("a-low", 20, t0, "work", priority=1)
          + specs("b-high", 20, t0, "work", priority=9))
    runs = Runs({"warm": 0.05, "work": 0.02})
    with polling(store, runs, concurrency=1):
        wait_until(lambda: len(runs.of("work")) == 40, 60, "all 40 jobs")
    order = [r.priority for r in runs.of("work")]
    return order[1:] if order[0] == 1 else order  # the first may be running as the rest come due


@pytest.mark.parametrize("warm_up", [
    pytest.param(False, id="chunks"),
    pytest.param(True, id="one-by-one"),
])
def test_priority_9_starts_before_priority_1_under_saturation(fstore, warm_up):
    """Without a warm-up the workers take due jobs in chunks (a slow chunk hands its
    unstarted jobs back to wait their turn by priority again)."""
    order = priorities_in_start_order(fstore, warm_up)
    assert order == sorted(order, reverse=True), order


def held(poller: Poller, kind: str) -> float:
    return float(poller.core.metrics.held.labels(kind)._value.get())


def sentinels(prefix: str, at_ms: int, shard_count: int) -> list[JobSpec]:
    """A job of kind ``sentinel`` due at ``at_ms`` in each shard: once all have run, every
    shard was read and dispatched past ``at_ms`` (a shard is read in fire-time order)."""
    ids: dict[int, str] = {}
    i = 0
    while len(ids) < shard_count:
        ids.setdefault(shard_of(f"{prefix}{i}", shard_count), f"{prefix}{i}")
        i += 1
    return [JobSpec(job_id, from_ms(at_ms), "sentinel") for job_id in ids.values()]


def pause_while_polling(store: Store, runs: Runs, poller: Poller, placed_ms: int) -> list[str]:
    """With the poller firing another kind, pause ``paused`` and schedule 30 of its jobs
    (due over 0.6 s) beside 20 of the other kind. Returns the held ids, once the other
    kind fired, the held gauge is above 0 and each held job's row was placed at least
    ``placed_ms`` after its due time."""
    write(store, specs("warm", 5, now_ms() + LEAD_MS, "other", step_ms=100))
    wait_until(lambda: len(runs.of("other")) == 5, 30, "the poller firing")
    store.set_paused("paused", True, now_ms())
    t0 = now_ms() + LEAD_MS
    write(store, specs("p", 30, t0, "paused", step_ms=20) + specs("o", 20, t0 + 500, "other", step_ms=100))
    ids = [f"p{i:04d}" for i in range(30)]

    def placed() -> bool:
        return all(j.fire_ms >= j.due_ms + placed_ms for j in store.get_many(ids).values())

    wait_until(lambda: len(runs.of("other")) == 25 and held(poller, "paused") > 0 and placed(),
               60, "the other kind fired, the paused one held")
    assert runs.of("paused") == [], "a paused kind fired"
    return ids


def test_pause_holds_a_kind_and_resume_fires_each_job_once_oldest_first(fstore):
    """The pause is set while the poller runs; the paused kind's jobs are held (placed
    HOLD_S ahead) while the other kind fires; after resume each fires once, oldest first."""
    runs = Runs()
    with polling(fstore, runs) as poller:
        ids = pause_while_polling(fstore, runs, poller, int(flowqueue.HOLD_S * 1000) - 2000)
        resumed = time.time() * 1000
        fstore.set_paused("paused", False, now_ms())
        wait_until(lambda: len(runs.of("paused")) >= 30, 60, "every held job after resume")
    fired = runs.of("paused")
    assert sorted(r.job_id for r in fired) == ids, "each held job fired exactly once"
    assert all(r.start_ms >= resumed for r in fired)
    assert fired[0].job_id in ids[:10], f"first after resume: {fired[0].job_id}, not among the oldest"


def test_a_held_job_is_held_again_and_fires_once_after_resume(fstore, monkeypatch):
    """While paused, a held job is placed ahead again each time it comes back; after
    resume it fires once, and not again from where it was last placed. HOLD_S is cut to
    3 s so that it comes back within seconds, not 30."""
    monkeypatch.setattr(flowqueue, "HOLD_S", 3.0)
    runs = Runs()
    with polling(fstore, runs) as poller:
        ids = pause_while_polling(fstore, runs, poller, 2 * 3000)  # held twice
        resumed = time.time() * 1000
        fstore.set_paused("paused", False, now_ms())
        placed = max(j.fire_ms for j in fstore.get_many(ids).values())
        wait_until(lambda: len(runs.of("paused")) >= 30, 60, "every held job after resume")
        # Until it reads the resume (a refresh), the poller may place some again, at most
        # HOLD_S from then: LEAD_MS from now is past that.
        write(fstore, sentinels("late", max(placed, now_ms() + LEAD_MS) + 1000, SHARDS))
        wait_until(lambda: len(runs.of("sentinel")) == SHARDS, 60, "every shard read past the placed jobs")
    fired = runs.of("paused")
    assert sorted(r.job_id for r in fired) == ids, "each held job fired exactly once"
    assert all(r.start_ms >= resumed for r in fired)


def test_a_rate_raised_live_takes_effect_within_5_s(fstore):
    """600 jobs at 5/s, so most of them are placed later at that rate; once 10 started the
    rate goes to 50/s: within 5 s the backlog starts at the new rate, placed jobs too."""
    fstore.set_limits("live", 5.0, None, None, None, now_ms())
    write(fstore, specs("l", 600, now_ms() + LEAD_MS, "live"))
    runs = Runs()
    with polling(fstore, runs):
        wait_until(lambda: runs.count("live") >= 10, 60, "10 started at 5/s")
        changed = time.time() * 1000
        fstore.set_limits("live", 50.0, None, None, None, now_ms())
        wait_until(lambda: any(r.start_ms >= changed + 8000 for r in runs.of("live")), 30,
                   "a start 8 s after the change")
    live = runs.of("live")
    starts = [r.start_ms for r in live]
    assert max_in_window([s for s in starts if s < changed]) <= 5 + 1, "over 5/s (burst 1) before"
    assert max_in_window([s for s in starts if s >= changed]) <= 50 + 5, "over 50/s (burst 5) after"
    # From 5 s after the change on, at 0.7 of the new rate: not only the jobs kept queued.
    assert in_span(live, changed + 5000, changed + 8000) >= 0.7 * 50 * 3, "the new rate did not hold"


def test_a_kind_never_runs_more_than_its_concurrency(fstore):
    """Concurrency 3, handlers of 0.1 s; an unlimited kind alongside runs wider."""
    n = 3
    fstore.set_limits("capped", None, None, n, None, now_ms())
    write(fstore, specs("c", 45, now_ms() + LEAD_MS, "capped") + specs("u", 30, now_ms() + LEAD_MS, "free"))
    runs = Runs({"capped": 0.1, "free": 0.1})
    with polling(fstore, runs):
        wait_until(lambda: len(runs.of("capped")) == 45 and len(runs.of("free")) == 30, 60, "all jobs")
    assert max_overlap(runs.of("capped")) == n, max_overlap(runs.of("capped"))
    assert max_overlap(runs.of("free")) > n, "the limit is the kind's, not the poller's"


def test_a_stopping_poller_still_publishes_the_handlers_it_waits_for(fstore):
    """A graceful stop waits for running handlers; until they end, the poller's row must
    go on counting them, or the others would take their slots beside them."""
    fstore.set_limits("capped", None, None, 2, None, now_ms())
    write(fstore, specs("c", 2, now_ms() + LEAD_MS, "capped"))
    release = threading.Event()
    started: list[str] = []

    def handler(job: Job) -> None:
        started.append(job.job_id)
        release.wait(30)

    poller = Poller(fstore, App.for_function(handler), config=PollerConfig(check_clock=False), name="p0")
    poller.start(range(SHARDS), epoch=1)
    try:
        wait_until(lambda: len(started) == 2, 30, "both handlers running")
        stopper = threading.Thread(target=poller.stop, kwargs={"timeout_s": 30})
        stop_ms = now_ms()
        stopper.start()

        def published_after_stop() -> bool:
            rows = [d for d in fstore.demands(now_ms(), 60_000) if d.poller == "p0" and d.kind == "capped"]
            return any(d.at_ms > stop_ms + 1000 and d.running == 2 for d in rows)

        wait_until(published_after_stop, 10, "a publish, counting both handlers, after the stop began")
    finally:
        release.set()
        poller.stop(timeout_s=10)
