"""Recurring schedules on a real fleet: three poller processes, Cassandra and
ZooKeeper, 50 schedules every 5 s, one poller killed with -9, then a pause, a delete and
an update while they run. Every nominal time fires, none early, none twice beyond the
crash bound (an occurrence the killed poller had dispatched and not yet recorded), and
nothing fires after a pause or a delete returned (an occurrence whose check had passed
may finish starting: the second of slack)."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest

from scheduler.domain.model import parse_occurrence
from scheduler.recurring.schedule import Occurrence, occurrence_id
from tests.handlers import read_records
from tests.integration.test_fleet import fleet_env, owned, poller, serving  # noqa: F401  (the fixture)
from tests.procs import log_tail, wait_until

SCHEDULES = 50
EVERY_MS = 5000


# Alone: once, run beside another file, s2's new version fired fewer than twice in 60 s
# (not reproduced since). If it fails alone too, its explanation says where the chain stopped.
@pytest.mark.serial
def test_fifty_schedules_three_pollers_and_a_kill_9(fleet_env):  # noqa: F811
    url, client, out, zk, procs = fleet_env
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=8)
    start_ms = int(start.timestamp() * 1000)
    for i in range(SCHEDULES):
        client.recurring.create(f"s{i}", kind="record", every="5s", start=start)
    store = client.store
    procs += [poller(url, out, zk, f"r{i}") for i in range(3)]
    # The kill waits for what it needs: a settled fleet (every shard claimed, each of the
    # three firing), in which the victim owns shards and has fired occurrences from them
    # (chains that must move to another owner).
    names, every = {"r0", "r1", "r2"}, set(range(8))

    def settled() -> bool:
        held = {c.shard for c in store.checkpoints() if c.owner in names}
        return held == every and all(serving(store, out, f"r{i}", p) for i, p in enumerate(procs))

    wait_until(settled, 90, "every shard claimed, three pollers firing")
    victim = owned(store, "r1")
    killed_at = time.time() * 1000
    procs[1].kill()
    procs[1].wait()
    assert victim, "the killed poller owned shards"
    wait_until(lambda: not owned(store, "r1"), 60, "the killed poller's shards taken over")
    # Changes while the pollers run: s0 paused, s1 deleted, s2 every 10 s from now on.
    client.recurring.pause("s0")
    paused_at = time.time() * 1000
    client.recurring.delete("s1")
    deleted_at = time.time() * 1000
    client.recurring.update("s2", every="10s")

    def v2_fired() -> list[int]:
        return sorted({o.nominal_ms for r in read_records(str(out))
                       if (o := _occ(r.job_id)) is not None and o.schedule_id == "s2" and o.version == 2})

    def explain() -> str:
        s2 = [(o.version, o.nominal_ms - start_ms, r.fired_ms - start_ms, r.pid)
              for r in read_records(str(out)) if (o := _occ(r.job_id)) is not None and o.schedule_id == "s2"]
        rows = [(j.job_id, j.status, j.due_ms - start_ms) for j in store.get_many(
            [occurrence_id("s2", 2, start_ms + k * 10_000) for k in range(30)]).values()]
        return (f"s2 fired (version, nominal, fired, pid; ms from start): {s2}\n"
                f"s2 v2 rows: {rows}\nexit codes: {[p.poll() for p in procs]}, "
                f"owners: {sorted((c.shard, c.owner) for c in store.checkpoints())}\n"
                f"poller log:\n{log_tail(Path(f'{out}.log'))}")

    wait_until(lambda: len(v2_fired()) >= 2, 60, "two occurrences of s2's new version", explain)
    cutoff = int(time.time() * 1000) - 6000  # every nominal time up to here must have fired
    changed = {"s0": paused_at, "s1": deleted_at, "s2": deleted_at}
    # A change supersedes what has not fired yet, and a chain that was on the killed poller
    # runs late until its shard has a new owner (session timeout 4 s, then the late margin
    # 3 s): a nominal time that close before a change may rightly never fire. (Seen once:
    # s1's occurrence at 15 s fired 5.3 s late after the kill, so the one at 20 s was
    # placed at about 23.3 s, and the delete came about then.)
    expected = {(f"s{i}", t) for i in range(SCHEDULES) for t in range(start_ms, cutoff, EVERY_MS)
                if t < changed.get(f"s{i}", float("inf")) - 8000}

    def fired() -> set[tuple[str, int]]:
        return {(o.schedule_id, o.nominal_ms) for r in read_records(str(out))
                if (o := _occ(r.job_id)) is not None}

    wait_until(lambda: expected <= fired(), 30, "every nominal time")
    records = read_records(str(out))
    assert not [r for r in records if r.fired_ms < r.due_ms], "fired before its nominal time"
    counts = Counter(r.job_id for r in records)
    dups = {j for j, c in counts.items() if c > 1}
    recent = {r.job_id for r in records if r.pid == procs[1].pid and r.fired_ms >= killed_at - 3000}
    assert dups <= recent, f"duplicates beyond the crash bound: {sorted(dups - recent)[:5]}"
    for p in procs:
        assert p.poll() is None or p is procs[1], "the other pollers rode the kill out"
    after = [(o, r.fired_ms) for r in records if (o := _occ(r.job_id)) is not None]
    assert not [f for o, f in after if o.schedule_id == "s1" and f > deleted_at + 1000], "fired after delete"
    assert not [f for o, f in after if o.schedule_id == "s0" and f > paused_at + 1000], "fired while paused"
    v2 = v2_fired()
    assert len(v2) >= 2 and all(b - a == 10_000 for a, b in pairwise(v2)), v2


def _occ(job_id: str) -> Occurrence | None:
    parsed = parse_occurrence(job_id)
    return None if parsed is None else Occurrence(*parsed)
