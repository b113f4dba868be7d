"""Flow control across a fleet of real poller processes (Cassandra, ZooKeeper): a fleet-wide
rate limit through a kill -9, and a pause through a rebalance. Starts are read from the
records the pollers' handler writes (``tests.handlers.record``: the fire time is taken as
the handler starts, by the same wall clock on every process of this machine)."""

from __future__ import annotations

import time

from scheduler import JobSpec
from scheduler.domain.clock import SystemClock
from scheduler.domain.keys import from_ms
from scheduler.store import Store
from tests.contract.test_flow_poller_contract import max_in_window, sentinels
from tests.handlers import read_records
from tests.integration.test_fleet import check, fleet_env, owned, poller, serving  # noqa: F401  (the fixture)
from tests.procs import schedule, wait_until

SHARDS = set(range(8))  # fleet_env's shard count


def now_ms() -> int:
    return SystemClock().now_ms()


def publishing(store: Store, kind: str) -> set[str]:
    """The pollers whose demand for ``kind`` is fresh (published in the last 3 s)."""
    return {d.poller for d in store.demands(now_ms(), 3000) if d.kind == kind}


def test_a_fleet_wide_rate_holds_through_a_kill_9(fleet_env):  # noqa: F811
    """Three pollers share 20/s (burst 10) over a backlog of 700 jobs due at once; one is
    killed with -9 a third of the way through. Every job fires (only the dead poller's
    last ones may fire twice); once its demand has aged out (5 s) and its shards are taken
    over (4 s session), the two left keep at least 0.6 of the rate; and no second,
    fleet-wide, has more starts than rate + burst: not as the backlog falls due on every
    poller at once, nor as the dead poller's part goes to the others."""
    url, client, out, zk, procs = fleet_env
    store = client.store
    rate, burst = 20.0, 10
    store.set_limits("record", rate, burst, None, None, now_ms())
    names = ["p0", "p1", "p2"]
    procs += [poller(url, out, zk, name) for name in names]
    wait_until(lambda: all(owned(store, n) for n in names) and publishing(store, "record") == set(names),
               60, "three pollers owning shards and publishing their demand")
    due = schedule(client, 700, 0, lead_s=5, prefix="r")
    wait_until(lambda: len(read_records(str(out))) >= 200 and serving(store, out, "p1", procs[1]), 60,
               "200 fired, p1 among the firing")
    assert owned(store, "p1"), "the poller to kill owns shards"
    killed_at = time.time() * 1000
    procs[1].kill()
    procs[1].wait()
    wait_until(lambda: set(due) <= {r.job_id for r in read_records(str(out))}, 120, "every job")
    records = read_records(str(out))
    counts = check(records, due)
    recent = {r.job_id for r in records if r.pid == procs[1].pid and r.fired_ms >= killed_at - 3000}
    assert {j for j, c in counts.items() if c > 1} <= recent, "refired jobs the killed poller had not"
    starts = [float(r.fired_ms) for r in records]
    # After the kill: from when the shares are split among the two left, to the end.
    settled, last = killed_at + 8000, max(starts)
    assert last - settled >= 5000, "the backlog ended too soon after the kill to measure a rate"
    after = sum(1 for s in starts if s >= settled)
    assert after >= 0.6 * rate * (last - settled) / 1000, (after, last - settled)
    assert any(r.pid == procs[2].pid and r.fired_ms >= settled for r in records)
    worst = max_in_window(starts)
    assert worst <= rate + burst, f"{worst} starts in one second, fleet-wide (limit {rate:g}/s + {burst})"


def test_a_pause_holds_through_a_rebalance_and_resume_fires_everything(fleet_env):  # noqa: F811
    """Two pollers; ``held`` is paused, then its 120 jobs fall due over 15 s beside 60 of
    another kind. One poller is killed with -9 and another joins (its shards move twice).
    Nothing of ``held`` fires while paused: not from the poller that takes over the dead
    one's shards, nor from the newcomer before its first read of the pauses. After resume,
    every held job fires, and only once: also after the time it had been placed at."""
    url, client, out, zk, procs = fleet_env
    store = client.store
    procs += [poller(url, out, zk, "p0"), poller(url, out, zk, "p1")]
    wait_until(lambda: bool(owned(store, "p0")) and bool(owned(store, "p1")), 60, "both owning shards")
    store.set_paused("held", True, now_ms())
    t0 = now_ms() + 6000
    jobs = client.schedule_many([JobSpec(f"h{i:03d}", from_ms(t0 + i * 125), "held") for i in range(120)]
                                + [JobSpec(f"o{i:03d}", from_ms(t0 + i * 250), "other") for i in range(60)])
    held = {j.job_id: j.due_ms for j in jobs if j.kind == "held"}
    other = {j.job_id: j.due_ms for j in jobs if j.kind == "other"}
    wait_until(lambda: serving(store, out, "p0", procs[0]) and serving(store, out, "p1", procs[1]), 60,
               "both pollers firing the other kind")
    procs[1].kill()
    procs[1].wait()
    procs.append(poller(url, out, zk, "p2"))
    wait_until(lambda: not owned(store, "p1") and bool(owned(store, "p2"))
               and owned(store, "p0") | owned(store, "p2") == SHARDS, 60,
               "the dead poller's shards taken over, the newcomer owning some")
    wait_until(lambda: set(other) <= {r.job_id for r in read_records(str(out))}, 60, "every other job")
    wait_until(lambda: all(j.fire_ms >= j.due_ms + 20_000 for j in store.get_many(list(held)).values()),
               60, "every held job placed ahead")
    fired = [r for r in read_records(str(out)) if r.job_id in held]
    assert not fired, f"a paused kind fired: {fired[:3]}"
    resumed = time.time() * 1000
    store.set_paused("held", False, now_ms())
    wait_until(lambda: set(held) <= {r.job_id for r in read_records(str(out))}, 90, "every held job")
    # Then past every place a held job was put at (HOLD_S, 30 s, from at most a refresh
    # after the resume): a job brought back early must not fire again from there.
    late = sentinels("late", int(resumed) + 33_000, len(SHARDS))
    client.schedule_many(late)
    wait_until(lambda: {j.job_id for j in late} <= {r.job_id for r in read_records(str(out))}, 90,
               "every shard read past the held jobs' places")
    records = read_records(str(out))
    counts = check([r for r in records if r.job_id in held], held)
    assert max(counts.values()) == 1, [j for j, c in counts.items() if c > 1][:5]
    early = [r for r in records if r.job_id in held and r.fired_ms < resumed]
    assert not early, f"fired before the resume: {early[:3]}"
    check([r for r in records if r.job_id in other], other)
