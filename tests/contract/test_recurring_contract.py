"""Recurring schedules on both stores, driven step by step with an injected clock: the
chain, no drift, pause/resume, update, delete and re-create, overlap, misfire, and a
crash between firing an occurrence and writing the next."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise
from typing import Any

import pytest

from scheduler import App, Client, Job, ScheduleConflict, ScheduleNotFound, Status
from scheduler.domain.clock import FakeClock
from scheduler.domain.keys import from_ms
from scheduler.errors import InvalidInput
from scheduler.producer import occurrences as writes
from scheduler.recurring.schedule import occurrence_id
from scheduler.store import SchemaOptions
from tests.conftest import make_store
from tests.contract.test_poller_contract import T0, T0_MS, drive, make_poller

EVERY = 5_000


@pytest.fixture
def rstore(store_kind: str, request: Any, tmp_path: Any):
    st = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=4), now_ms=T0_MS - 60_000)
    yield st
    st.close()


class Calls:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.fired: list[tuple[str | None, int, int]] = []  # schedule, nominal, fired at

    def __call__(self, job: Job) -> None:
        assert job.scheduled_for is not None
        self.fired.append((job.schedule_id, int(job.scheduled_for.timestamp() * 1000), self.clock.now_ms()))

    def nominal(self, sid: str) -> list[int]:
        return [n for s, n, _ in self.fired if s == sid]


def setup(rstore: Any, make_client: Any, handler: Any = None) -> tuple[FakeClock, Client, Calls, Any]:
    clock = FakeClock(T0_MS)
    client = make_client(rstore, clock=clock)
    calls = Calls(clock)
    app = App.for_function(handler or calls)
    poller = make_poller(rstore, clock, None, app=app)
    return clock, client, calls, poller


def drive_recording_every(poller: Any, clock: FakeClock, seconds: float, every_ms: int) -> list[int]:
    """``drive``, but outcomes are recorded only every ``every_ms`` of fake time: a run
    lasts until then. Returns when they were recorded."""
    records: list[int] = []
    end = clock.now_ms() + int(seconds * 1000)
    while clock.now_ms() < end:
        poller.poll_once()
        for job in poller.dispatch_ready():
            poller.fire(job)
        clock.advance(0.1)
        if clock.now_ms() % every_ms < 100:
            poller.record_outcomes()
            records.append(clock.now_ms())
    return records


def test_every_nominal_time_fires_once_on_time_without_drift(rstore, make_client):
    clock, client, calls, poller = setup(rstore, make_client)
    client.recurring.create("r", kind="tick", every="5s", payload={"n": 1})
    drive(poller, clock, 61)
    times = calls.nominal("r")
    assert times == [T0_MS + i * EVERY for i in range(len(times))] and len(times) >= 12
    assert max(Counter(times).values()) == 1
    for _, nominal, at in calls.fired:
        assert nominal <= at <= nominal + 3100, "never early; late only by the late margin at first"
    assert all(at - n <= 100 for _, n, at in calls.fired[1:]), "later ones on time"
    view = client.recurring.view(client.recurring.get("r"))
    assert view["last_fired_at"] is not None and view["next_fire_at"] is not None


def test_pause_skips_and_resume_goes_on_from_the_next_time(rstore, make_client):
    clock, client, calls, poller = setup(rstore, make_client)
    client.recurring.create("p", kind="tick", every="5s")
    drive(poller, clock, 12)
    client.recurring.pause("p")
    before = len(calls.fired)
    drive(poller, clock, 30)
    assert len(calls.fired) == before, "nothing fires while paused"
    resumed_at = clock.now_ms()
    client.recurring.resume("p")
    drive(poller, clock, 20)
    later = [n for n in calls.nominal("p") if n > resumed_at - EVERY]
    assert later and min(later) > resumed_at, "paused time is never caught up"
    assert client.recurring.get("p").skipped >= 1


def test_update_supersedes_and_delete_stops_and_recreate_starts_fresh(rstore, make_client):
    """bullmq#3063: a schedule re-created under the same id must run again."""
    clock, client, calls, poller = setup(rstore, make_client)
    client.recurring.create("u", kind="tick", every="5s")
    drive(poller, clock, 11)
    client.recurring.update("u", every="7s")
    assert client.recurring.get("u").version == 2
    drive(poller, clock, 30)
    client.recurring.delete("u")
    deleted_at = clock.now_ms()
    drive(poller, clock, 20)
    assert all(at <= deleted_at for s, _, at in calls.fired if s == "u"), "nothing fires after delete"
    with pytest.raises(ScheduleNotFound):
        client.recurring.get("u")
    again = client.recurring.create("u", kind="tick", every="5s")
    assert again.version == 4
    drive(poller, clock, 12)
    assert any(at > deleted_at + 20_000 for s, _, at in calls.fired if s == "u")


def test_the_dispatchers_decisions_are_used_only_while_fresh(rstore, make_client, monkeypatch):
    """``pregate`` reads the schedules of everything dispatched at once; a worker uses
    that decision for DECISION_FRESH_S after its read began, once, and reads again
    after it. A change through the API waits that long, so none made before it is used
    once it returned.

    The decisions' age is read from a clock the test holds (how long the store takes
    to write a change behind the API's back is no part of it); the last step runs on
    the real clock, where the API's wait is what makes the decision stale."""
    import time
    from dataclasses import replace

    import scheduler.poller.occurrences as occurrences
    from scheduler.recurring.chain import DECISION_FRESH_S
    from scheduler.recurring.schedule import State

    held: list[float] = [1000.0]

    def monotonic() -> float:
        return held[0] if held else time.monotonic()

    monkeypatch.setattr(occurrences, "time", type("HeldTime", (), {"monotonic": staticmethod(monotonic)}))
    _, client, _, poller = setup(rstore, make_client)
    s = client.recurring.create("g", kind="tick", every="5s")
    job = client.run(writes.place(client.producer, s, s.rule.anchor_ms))
    occ = poller.occurrences
    occ.pregate([job])
    # Behind the API's back (it would wait out the decision): paused in the store.
    assert rstore.replace_schedule(replace(s, state=State.PAUSED), s.version)
    assert occ.gate([job]) == {}, "a fresh decision is used as it is"
    assert occ.gate([job])[job.job_id].error == "skipped: paused", "and only once"
    occ.pregate([job])
    assert rstore.replace_schedule(s, s.version)
    held[0] += DECISION_FRESH_S * 1.01
    assert occ.gate([job]) == {}, "a stale one is read again"
    held.clear()  # the real clock from here on
    occ.pregate([job])
    client.recurring.pause("g")
    assert occ.gate([job])[job.job_id].error == "skipped: paused", "the API waited it out"


def test_one_read_holding_both_versions_of_an_updated_schedule_keeps_the_new_chain(rstore, make_client):
    """An update whose first occurrence falls at the same time as the old chain's next
    one: a read may return both rows, the old version's first. The schedule cached for
    the old row must not serve the new one: its successor is written, and the new
    chain goes on."""
    _, client, _, poller = setup(rstore, make_client)
    old = client.recurring.create("v", kind="tick", every="5s", start=T0)
    occ = poller.occurrences
    occ._read(["v"])  # the old version cached, as after a read of its previous row
    new = client.recurring.update("v", every="10s")
    at = T0_MS + 20_000  # a time of both versions
    rows = [client.run(writes.place(client.producer, s, at)) for s in (old, new)]
    occ.write_successors(rows)
    ids = [occurrence_id("v", new.version, at + 10_000), occurrence_id("v", old.version, at + 5_000)]
    found = rstore.get_many(ids)
    assert ids[0] in found, "the new version's next occurrence is written"
    assert ids[1] not in found, "the old version's chain ends"


def test_a_crash_between_firing_and_the_next_write_keeps_the_chain(rstore, make_client):
    """db-scheduler#189/#565: a chain that never resumes after a crash mid-run. The
    first owner fires an occurrence, then dies before its successor write and before
    recording anything; the next owner re-reads that occurrence and the chain goes on."""
    clock, client, calls, p1 = setup(rstore, make_client)
    client.recurring.create("c", kind="tick", every="5s")
    drive(p1, clock, 7)

    def crash(rows: list[Job]) -> None:
        from scheduler.errors import StoreUnavailable
        raise StoreUnavailable("injected: the process dies here")

    # p1 fires what it already queued, then every successor write fails: it never
    # records anything again (it is dead).
    p1.reader.on_rows = crash
    end = clock.now_ms() + 6_000
    while clock.now_ms() < end:
        p1.poll_once()
        for job in p1.dispatch_ready():
            p1.fire(job)
        clock.advance(0.1)
    p2 = make_poller(rstore, clock, None, epoch=2, app=App.for_function(calls))
    drive(p2, clock, 30)
    times = calls.nominal("c")
    expected = list(range(T0_MS, clock.now_ms() - 3000, EVERY))
    assert set(expected) <= set(times), "every nominal time fired"
    assert max(Counter(times).values()) <= 2, "a duplicate at most, for the crashed one"


def test_overlap_skip_never_runs_two_at_once(rstore, make_client):
    """A run lasts until its outcome is recorded; here outcomes are recorded every 12 s
    while the schedule fires every 5 s: the occurrences in between are skipped."""
    clock, client, calls, poller = setup(rstore, make_client)
    client.recurring.create("o", kind="tick", every="5s", overlap="skip")
    drive_recording_every(poller, clock, 40, 12_000)
    poller.record_outcomes()
    times = calls.nominal("o")
    assert len(times) >= 2 and all(b - a >= 10_000 for a, b in pairwise(times))
    assert client.recurring.get("o").skipped >= 2


def test_misfire_fire_once_after_downtime(rstore, make_client):
    clock, client, calls, poller = setup(rstore, make_client)
    client.recurring.create("m", kind="tick", every="5s")
    drive(poller, clock, 6)
    fired_before = len(calls.nominal("m"))
    clock.advance(300)  # five minutes down
    back_at = clock.now_ms()
    drive(poller, clock, 12)
    after = calls.nominal("m")[fired_before:]
    missed = [n for n in after if n <= back_at]
    assert len(missed) == 1, "the sixty missed times fire once"
    assert back_at - missed[0] < EVERY, "the most recent of them"
    assert client.recurring.get("m").skipped >= 1


def test_bad_input_writes_nothing(rstore, make_client):
    clock = FakeClock(T0_MS)
    client = make_client(rstore, clock=clock)
    bad: list[dict[str, Any]] = [
        {"cron": "61 * * * *"}, {"every": "0s"}, {"cron": "* * * * *", "every": "5s"},
        {"every": "5s", "tz": "Nowhere/Land"}, {"every": "5s", "overlap": "sometimes"},
        {"every": "5s", "misfire": "later"}]
    for kwargs in bad:
        with pytest.raises(InvalidInput):
            client.recurring.create("bad", kind="tick", **kwargs)
    assert client.recurring.list() == []
    with pytest.raises(InvalidInput):
        client.schedule("recurring:x:1:5", T0, "k")
    client.recurring.create("same", kind="tick", cron="@hourly")
    client.recurring.create("same", kind="tick", cron="@hourly")  # identical: a no-op
    with pytest.raises(ScheduleConflict):
        client.recurring.create("same", kind="tick", cron="@daily")
    assert [s.schedule_id for s in client.recurring.list()] == ["same"]
    assert from_ms(T0_MS) == T0


def test_a_broken_chain_is_found_and_repaired(rstore, make_client):
    clock, client, calls, poller = setup(rstore, make_client)
    client.recurring.create("b", kind="tick", every="5s")
    client.recurring.create("ok", kind="tick", every="5s")
    drive(poller, clock, 70)
    assert client.recurring.check() == []
    # Remove b's stored occurrences by hand (a partial restore, a bug): nothing would
    # fire again.
    for job in rstore.get_many([j for j in _ids(rstore, "b")]).values():
        if job.status is not Status.FIRED:
            rstore.cancel(job)
    drive(poller, clock, 10)
    assert [s.schedule_id for s in client.recurring.check()] == ["b"]
    assert [s.schedule_id for s in client.recurring.check(repair=True)] == ["b"]
    assert client.recurring.check() == []
    before = len(calls.nominal("b"))
    drive(poller, clock, 12)
    assert len(calls.nominal("b")) > before


def _ids(store: Any, sid: str) -> list[str]:
    s = store.get_schedules([sid])[sid]
    now = T0_MS + 200_000
    times = [t for t in range(s.rule.anchor_ms, now, EVERY)]
    from scheduler.recurring.schedule import occurrence_id
    return [occurrence_id(sid, s.version, t) for t in times]


def test_resume_right_after_an_occurrence_was_read_while_paused(rstore, make_client):
    """The occurrence read while paused wrote no successor; resume writes it."""
    clock, client, calls, poller = setup(rstore, make_client)
    client.recurring.create("rp", kind="tick", every="5s")
    drive(poller, clock, 7.5)  # T0+5 s fired; T0+10 s is due in 2.5 s
    client.recurring.pause("rp")
    drive(poller, clock, 1.5)  # T0+10 s is read (2 s ahead) while paused
    client.recurring.resume("rp")
    drive(poller, clock, 30)
    times = calls.nominal("rp")
    assert T0_MS + 10_000 in times, "the occurrence read while paused fires once resumed in time"
    assert [t for t in times if t > T0_MS + 10_000] == [T0_MS + 10_000 + i * EVERY for i in range(1, 6)]
    assert max(Counter(times).values()) == 1, "resume does not move a pending occurrence (a duplicate)"


def test_overlap_buffer_one_runs_the_waiting_one_after_the_running_one(rstore, make_client):
    """Runs last until their outcomes are recorded, every 12 s here, while the schedule
    fires every 5 s: one occurrence waits for the running one, the others are skipped."""
    clock, client, calls, poller = setup(rstore, make_client)
    client.recurring.create("bo", kind="tick", every="5s", overlap="buffer_one")
    records = drive_recording_every(poller, clock, 40, 12_000)
    fired = [(n, at) for s, n, at in calls.fired if s == "bo"]
    assert len(fired) >= 3
    for (_, a), (_, b) in pairwise(fired):
        # The next run starts only after the previous one's outcome was recorded.
        assert any(a < r <= b for r in records), (a, b)
    waited = [n for n, at in fired if at - n > 1000]
    assert waited, "a buffered occurrence ran late, after the running one"
    assert client.recurring.get("bo").skipped >= 1


def test_jitter_is_deterministic_and_never_early(rstore, make_client):
    clock = FakeClock(T0_MS)
    client = make_client(rstore, clock=clock)
    s = client.recurring.create("j", kind="tick", cron="0 * * * *", jitter="10m")
    nominal = s.first_after(T0_MS + 3_600_000)
    assert nominal is not None
    a, b = (client.run(writes.place(client.producer, s, nominal)) for _ in range(2))
    assert a == b and nominal <= a.fire_ms < nominal + 600_000 and a.due_ms == nominal
    assert a.scheduled_for == from_ms(nominal) and a.schedule_id == "j"


@pytest.mark.parametrize("misfire,window,expect", [
    ("skip", "1h", 0),  # none of the 60 missed times
    ("fire_all", "1h", 60),  # every one, oldest first
    ("fire_all", "2m", 24),  # only those within the catch-up window
])
def test_misfire_skip_and_fire_all(rstore, make_client, misfire, window, expect):
    clock, client, calls, poller = setup(rstore, make_client)
    client.recurring.create("m", kind="tick", every="5s", misfire=misfire, catchup_window=window)
    drive(poller, clock, 6)
    fired_before = len(calls.nominal("m"))
    clock.advance(300)  # five minutes down: 60 nominal times missed
    back_at = clock.now_ms()
    drive(poller, clock, 30, step_ms=200)
    missed = [n for n in calls.nominal("m")[fired_before:] if n <= back_at]
    assert abs(len(missed) - expect) <= 1, (misfire, window, len(missed))
    assert missed == sorted(missed), "oldest first"
    later = [n for n in calls.nominal("m") if n > back_at]
    assert later, "the chain goes on after the catch-up"
