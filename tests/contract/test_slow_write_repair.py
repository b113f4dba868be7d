"""Slow-write repair on both stores: a job whose write is acknowledged too late for the
cursors is moved ahead of them once, in one concurrent round, and moved again only when
the move itself was slow; the owner is told which old rows were retired."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest

from scheduler import Client, JobSpec
from scheduler.domain.clock import FakeClock
from scheduler.producer import repair
from tests.contract.test_poller_contract import T0, clock, pstore

__all__ = ["clock", "pstore"]  # the fixtures, shared


def slow(pstore: Any, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, name: str,
         delays: list[float]) -> list[Any]:
    """Make ``pstore.<name>`` acknowledge ``delays[i]`` seconds late on its i-th call
    (then at once); returns the list of argument tuples it was called with."""
    real = getattr(pstore, name)
    seen: list[Any] = []

    def wrapper(*args: Any) -> Any:
        out = real(*args)
        seen.append(args)
        if len(seen) <= len(delays):
            clock.advance(delays[len(seen) - 1])
        return out

    monkeypatch.setattr(pstore, name, wrapper)
    return seen


def due_now(n: int) -> list[JobSpec]:
    return [JobSpec(f"j{i}", T0 + timedelta(milliseconds=20 * i), "k") for i in range(n)]


def test_a_slow_write_moves_every_job_once_in_one_round(pstore, clock, monkeypatch, caplog):
    client = Client(pstore, clock=clock)
    slow(pstore, clock, monkeypatch, "insert_many", [2.0])
    moves = slow(pstore, clock, monkeypatch, "move_many", [])
    with caplog.at_level(logging.WARNING, logger="scheduler.client"):
        jobs = client.schedule_many(due_now(50))
    assert len(moves) == 1 and len(moves[0][0]) == 50, "one round, every job once"
    ack = clock.now_ms()
    assert all(not repair.at_risk(client.producer.meta, j, ack) for j in jobs)
    assert {j.job_id: pstore.get(j.job_id).fire_ms for j in jobs} == {j.job_id: j.fire_ms for j in jobs}
    lines = [r for r in caplog.records if getattr(r, "action", "") == "slow_write_repaired"]
    assert len(lines) == 1 and lines[0].jobs == 50 and lines[0].rounds == 1


def test_the_move_leaves_room_for_its_own_write(pstore, clock, monkeypatch):
    client = Client(pstore, clock=clock)
    # The write took 2 s; its move takes 0.9 s: without room for it, every job would
    # be at risk again and moved a second time.
    slow(pstore, clock, monkeypatch, "insert_many", [2.0])
    moves = slow(pstore, clock, monkeypatch, "move_many", [0.9])
    client.schedule_many(due_now(20))
    assert len(moves) == 1


def test_only_a_slow_move_is_repeated(pstore, clock, monkeypatch):
    client = Client(pstore, clock=clock)
    slow(pstore, clock, monkeypatch, "insert_many", [1.0])
    moves = slow(pstore, clock, monkeypatch, "move_many", [4.0])
    jobs = client.schedule_many(due_now(10))
    assert len(moves) == 2, "the first move was slower than its room: one more round"
    assert [len(m[0]) for m in moves] == [10, 10]
    ack = clock.now_ms()
    assert all(not repair.at_risk(client.producer.meta, j, ack) for j in jobs)
    assert {j.job_id: pstore.get(j.job_id).fire_ms for j in jobs} == {j.job_id: j.fire_ms for j in jobs}


def test_a_quick_write_moves_nothing(pstore, clock, monkeypatch):
    client = Client(pstore, clock=clock)
    moves = slow(pstore, clock, monkeypatch, "move_many", [])
    client.schedule_many(due_now(20))
    assert moves == []


def test_an_owner_that_queued_the_old_row_fires_the_job_once(pstore, clock, monkeypatch):
    from tests.contract.test_due_now_contract import step
    from tests.contract.test_poller_contract import Recorder, make_poller

    client = Client(pstore, clock=clock)
    calls = Recorder(clock)
    poller = make_poller(pstore, clock, calls)
    pstore.set_notify_endpoint(poller.name, "127.0.0.1:9", clock.now_ms())
    sent: list[tuple[list[Any], list[Any]]] = []
    monkeypatch.setattr(client.producer.nudger, "_send",
                        lambda address, entries, retired: sent.append((entries, retired)))
    real = pstore.insert_many

    def slow_insert(jobs: Any, progress: Any = None) -> None:
        real(jobs, progress)
        clock.advance(1.2)  # within the owner's read horizon by now: it queues the row
        poller.poll_once()
        assert len(poller.core.due) == 1
        clock.advance(0.3)  # acknowledged 1.5 s after placement: at risk, moved

    monkeypatch.setattr(pstore, "insert_many", slow_insert)
    job = client.schedule("j0", T0, "k")
    retired = [r for _, rs in sent for r in rs]
    assert retired and retired[0][3] == "j0" and retired[0][2] != job.fire_ms, "the old row is named"
    for entries, rs in sent:
        poller.nudges.apply(entries, rs)
    step(poller, clock, 10)  # (the new row was nudged: it leaves at its due time)
    assert [c[0] for c in calls.calls] == ["j0"], "fired once, not at both positions"
    assert poller.stats.retired_dropped == 1


def test_a_job_cancelled_after_its_owner_queued_it_does_not_fire(pstore, clock, monkeypatch):
    from tests.contract.test_due_now_contract import step
    from tests.contract.test_poller_contract import Recorder, make_poller

    client = Client(pstore, clock=clock)
    calls = Recorder(clock)
    poller = make_poller(pstore, clock, calls)
    pstore.set_notify_endpoint(poller.name, "127.0.0.1:9", clock.now_ms())
    sent: list[tuple[list[Any], list[Any]]] = []
    monkeypatch.setattr(client.producer.nudger, "_send",
                        lambda address, entries, retired: sent.append((entries, retired)))
    client.schedule("c0", T0 + timedelta(seconds=10), "k")
    clock.advance(8.5)
    poller.poll_once()
    assert len(poller.core.due) == 1, "read ahead and queued"
    assert client.cancel("c0")
    for entries, retired in sent:
        poller.nudges.apply(entries, retired)
    step(poller, clock, 5)
    assert calls.calls == [] and poller.stats.retired_dropped == 1


def test_a_row_that_fired_before_its_write_was_acknowledged_is_not_moved(pstore, clock, monkeypatch):
    from tests.contract.test_due_now_contract import step
    from tests.contract.test_poller_contract import Recorder, make_poller

    client = Client(pstore, clock=clock)
    calls = Recorder(clock)
    poller = make_poller(pstore, clock, calls)
    real = pstore.insert_many

    def very_slow_insert(jobs: Any, progress: Any = None) -> None:
        real(jobs, progress)
        step(poller, clock, 4)  # acknowledged after the row's placed time: it fired meanwhile
        assert [c[0] for c in calls.calls] == ["f0"]

    monkeypatch.setattr(pstore, "insert_many", very_slow_insert)
    moves = slow(pstore, clock, monkeypatch, "move_many", [])
    client.schedule("f0", T0, "k")
    assert moves == [], "a fired row was not lost: moving it would fire it again"
    step(poller, clock, 10)
    assert [c[0] for c in calls.calls] == ["f0"]


def test_a_client_rides_out_a_store_unavailable_on_its_first_read(pstore, monkeypatch):
    from scheduler.errors import StoreUnavailable

    real, failures = pstore.meta, [StoreUnavailable("no replica"), StoreUnavailable("no replica")]

    def flaky() -> Any:
        if failures:
            raise failures.pop()
        return real()

    monkeypatch.setattr(pstore, "meta", flaky)
    # A budget shorter than one failure (a driver timeout can take all of it): still tried
    # again, three times in all.
    client = Client(pstore, retry_s=0.01)
    assert failures == [] and client.meta == real()


def test_the_placement_clock_is_read_after_the_lookup(pstore, clock, monkeypatch):
    client = Client(pstore, clock=clock)
    slow(pstore, clock, monkeypatch, "get_many", [1.0])  # a fresh process's first read
    moves = slow(pstore, clock, monkeypatch, "move_many", [])
    job = client.schedule("p0", T0, "k")
    assert moves == [], "the write itself was quick: nothing to repair"
    assert job.fire_ms == clock.now_ms() + client.meta.late_margin_ms


def test_a_rescheduled_job_s_queued_old_row_does_not_fire(pstore, clock, monkeypatch):
    from tests.contract.test_due_now_contract import step
    from tests.contract.test_poller_contract import Recorder, make_poller

    client = Client(pstore, clock=clock)
    calls = Recorder(clock)
    poller = make_poller(pstore, clock, calls)
    pstore.set_notify_endpoint(poller.name, "127.0.0.1:9", clock.now_ms())
    sent: list[tuple[list[Any], list[Any]]] = []
    monkeypatch.setattr(client.producer.nudger, "_send",
                        lambda address, entries, retired: sent.append((entries, retired)))
    client.schedule("r0", T0 + timedelta(seconds=10), "k")
    clock.advance(8.5)
    poller.poll_once()
    assert len(poller.core.due) == 1, "read ahead and queued"
    client.reschedule("r0", T0 + timedelta(minutes=5))
    for entries, retired in sent:
        poller.nudges.apply(entries, retired)
    step(poller, clock, 5)
    assert calls.calls == [] and poller.stats.retired_dropped == 1


def armed_rows(pstore: Any, moves: list[list[Any]]) -> list[str]:
    """Job ids of the armed (unfired) bucket rows in every bucket any move touched."""
    where = {(j.bucket, j.shard) for pairs in moves for pair in pairs for j in pair}
    return sorted(r.job_id for bucket, shard in where
                  for r in pstore.read_bucket(bucket, shard, None, 2**62, 1000) if r.fired_at is None)


@pytest.mark.parametrize("fails_in", ["repair", "move"])
def test_a_failed_move_applied_after_its_retry_leaves_one_armed_row(pstore, clock, monkeypatch, fails_in):
    """A logged batch that failed may still be applied later, from the batchlog: a retry
    that placed the job anew would leave that batch's row armed beside its own. So the
    retry moves the job to the very rows the failed move wrote."""
    from scheduler.errors import StoreUnavailable

    client = Client(pstore, clock=clock)
    if fails_in == "move":
        # The first write landed late; the call is made again (a caller's retry), and
        # its move of the at-risk rows fails.
        slow(pstore, clock, monkeypatch, "insert_many", [2.0])

        def no_repair(_producer: Any, result: Any, *_: Any) -> Any:
            return result
            yield  # a generator of no effects

        monkeypatch.setattr(repair, "repair_slow_writes", no_repair)
        client.schedule_many(due_now(10))
        monkeypatch.undo()
        slow(pstore, clock, monkeypatch, "get_many", [2.0])
    else:
        slow(pstore, clock, monkeypatch, "insert_many", [2.0])
    real, tried = pstore.move_many, []

    def fails_once(pairs: Any) -> Any:
        tried.append(list(pairs))
        if len(tried) == 1:
            clock.advance(0.3)  # the failure took time: a fresh placement would differ
            raise StoreUnavailable("moving failed: no host answered")
        return real(pairs)

    monkeypatch.setattr(pstore, "move_many", fails_once)
    jobs = client.schedule_many(due_now(10))
    assert len(tried) >= 2
    real(tried[0])  # the failed batch, applied from the batchlog after the retry
    assert armed_rows(pstore, tried) == sorted(j.job_id for j in jobs), "one armed row each"
    assert len(client.producer.unsure) == 0


def test_a_failed_move_that_landed_is_not_reused_by_a_later_call(pstore, clock, monkeypatch):
    """The failed move landed; its retry finds it there and, the row being at risk,
    moves the job on. A later call for the same job must not move it back onto the
    first move's row: that row is retired, and on Cassandra a move onto it (which
    writes no fired_at) would leave the job with no armed row at all."""
    from scheduler.errors import StoreUnavailable

    client = Client(pstore, clock=clock)
    slow(pstore, clock, monkeypatch, "insert_many", [2.0])
    real, tried = pstore.move_many, []

    def lands_then_fails(pairs: Any) -> Any:
        tried.append(list(pairs))
        out = real(pairs)
        if len(tried) == 1:
            clock.advance(5.0)  # slow enough for the landed rows to be at risk again
            raise StoreUnavailable("moving timed out after it was applied")
        return out

    monkeypatch.setattr(pstore, "move_many", lands_then_fails)
    client.schedule_many(due_now(5))
    first_rows = {(n.bucket, n.shard, n.fire_ms) for _, n in tried[0]}
    assert len(tried) >= 2 and len(client.producer.unsure) == 0
    later = len(tried)
    client.schedule_many(due_now(5))  # the caller calls again
    assert not [n for pairs in tried[later:] for _, n in pairs
                if (n.bucket, n.shard, n.fire_ms) in first_rows], "never moved back onto a retired row"
