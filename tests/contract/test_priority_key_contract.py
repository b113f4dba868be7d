"""A job's priority and key on both stores: every write keeps them and every read returns
them (schedule, get, reschedule, load, retry, replay, re-fire, recurring occurrences), a
keyed job is placed in its key's shard, bad values write nothing, and rows written before
schema v007 read as priority 5 and no key."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from typing import Any

import pytest

from scheduler import App, Client, InvalidInput, JobSpec, SchemaError, Status
from scheduler.domain.clock import FakeClock
from scheduler.domain.flow import DEFAULT_PRIORITY
from scheduler.domain.keys import from_ms, shard_key, shard_of
from scheduler.observe.refire import fired_in_window, specs
from scheduler.store import SchemaOptions, Store
from scheduler.store.base import SCHEMA_VERSION
from tests.conftest import make_store
from tests.contract.test_poller_contract import drive, make_poller

T0_MS = 1_800_000_000_000
T0 = from_ms(T0_MS)
SHARDS = 16


@pytest.fixture
def kstore(store_kind: str, request: Any, tmp_path: Any):
    st = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=SHARDS), now_ms=T0_MS - 60_000)
    yield st
    st.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0_MS)


def stored(store: Store, job_id: str) -> tuple[int, str | None, int]:
    """(priority, key, shard) of the lookup row and of the pending bucket row, which agree."""
    job = store.get(job_id)
    assert job is not None
    [row] = [r for r in store.read_bucket(job.bucket, job.shard, None, 2**62, 10_000)
             if r.job_id == job_id and r.status is Status.PENDING]
    assert (row.priority, row.key, row.shard) == (job.priority, job.key, job.shard)
    return job.priority, job.key, job.shard


def test_schedule_get_reschedule_keep_priority_and_key(kstore, clock, make_client):
    client = make_client(kstore, clock=clock)
    job = client.schedule("p1", T0 + timedelta(minutes=5), "email", {"n": 1}, priority=9, key="customer-42")
    assert (job.priority, job.key) == (9, "customer-42")
    assert job.shard == shard_of("customer-42", SHARDS) != shard_of("p1", SHARDS)
    assert client.get("p1") == job
    assert stored(kstore, "p1") == (9, "customer-42", shard_of("customer-42", SHARDS))
    moved = client.reschedule("p1", T0 + timedelta(minutes=30))
    assert (moved.priority, moved.key, moved.shard) == (9, "customer-42", job.shard)
    assert stored(kstore, "p1") == (9, "customer-42", job.shard)
    # The same id and due time again: nothing changes, whatever this call's values.
    same = client.schedule("p1", T0 + timedelta(minutes=30), "email", priority=1, key="other")
    assert (same.priority, same.key) == (9, "customer-42")
    # Another due time: this call's priority and key win, and the key's shard with them.
    again = client.schedule("p1", T0 + timedelta(minutes=40), "email", priority=1, key="other")
    assert (again.priority, again.key, again.shard) == (1, "other", shard_of("other", SHARDS))
    assert stored(kstore, "p1") == (1, "other", again.shard)
    plain = client.schedule("p2", T0 + timedelta(minutes=5), "email")
    assert (plain.priority, plain.key, plain.shard) == (DEFAULT_PRIORITY, None, shard_of("p2", SHARDS))
    assert DEFAULT_PRIORITY == 5
    assert client.get("p2").to_dict()["priority"] == 5 and client.get("p2").to_dict()["key"] is None


def test_every_job_of_a_key_lands_in_the_key_shard(kstore, clock, make_client):
    client = make_client(kstore, clock=clock)
    jobs = client.schedule_many(
        [JobSpec(f"o{i}", T0 + timedelta(seconds=90 + i), "k", key="acct-7") for i in range(40)]
        + [{"id": f"d{i}", "at": (T0 + timedelta(seconds=90)).isoformat(), "kind": "k",
            "key": "acct-7", "priority": 0} for i in range(10)])
    assert {j.shard for j in jobs} == {shard_key("any", "acct-7", SHARDS)}
    assert all(stored(kstore, j.job_id) == (j.priority, "acct-7", j.shard) for j in jobs)
    assert [j.priority for j in jobs] == [5] * 40 + [0] * 10
    unkeyed = client.schedule_many([JobSpec(f"u{i}", T0 + timedelta(seconds=90), "k") for i in range(64)])
    assert len({j.shard for j in unkeyed}) > 1
    assert all(j.shard == shard_of(j.job_id, SHARDS) for j in unkeyed)


def test_a_job_due_now_is_placed_in_its_key_shard_too(kstore, clock, make_client):
    # Placed by the late-write rule (due in the past): the same placement rule.
    client = make_client(kstore, clock=clock)
    job = client.schedule("late", T0 - timedelta(hours=1), "k", key="k-1", priority=2)
    assert (job.shard, job.priority, job.key) == (shard_of("k-1", SHARDS), 2, "k-1")


@pytest.mark.parametrize("bad", [
    {"priority": 10}, {"priority": -1}, {"priority": True}, {"priority": "5"}, {"priority": 5.0},
    {"key": ""}, {"key": "x" * 257}, {"key": "é" * 129}, {"key": "a\nb"}, {"key": 42},
])
def test_bad_priority_or_key_writes_nothing(kstore, clock, make_client, bad):
    client = make_client(kstore, clock=clock)
    good = JobSpec("fine", T0 + timedelta(minutes=5), "k")
    with pytest.raises(InvalidInput):
        client.schedule("bad", T0 + timedelta(minutes=5), "k", **bad)
    with pytest.raises(InvalidInput, match="job #2"):
        client.schedule_many([good, {"id": "bad", "at": (T0 + timedelta(minutes=5)).isoformat(),
                                     "kind": "k", **bad}])
    assert kstore.get_many(["fine", "bad"]) == {}


def test_retry_replay_and_refire_keep_priority_and_key(kstore, clock):
    client = Client(kstore, clock=clock)
    app = App()
    calls: list[tuple[int, int, str | None, int]] = []

    @app.handler("flaky", max_attempts=2, backoff_base_s=1)
    def flaky(job):
        # The retry's row is in the key's shard too (the recorder places it).
        calls.append((job.attempt, job.priority, job.key, job.shard))
        raise ValueError("broken")

    @app.handler("ok")
    def ok(job):
        calls.append((0, job.priority, job.key, job.shard))

    client.schedule("f1", T0 + timedelta(seconds=5), "flaky", priority=8, key="tenant-1")
    client.schedule("g1", T0 + timedelta(seconds=5), "ok", priority=1, key="tenant-2")
    poller = make_poller(kstore, clock, None, app=app, shards=range(SHARDS))
    drive(poller, clock, 30)
    t1, t2 = shard_of("tenant-1", SHARDS), shard_of("tenant-2", SHARDS)
    assert sorted(calls) == [(0, 1, "tenant-2", t2), (1, 8, "tenant-1", t1), (2, 8, "tenant-1", t1)]
    dead = client.get("f1")
    assert (dead.status, dead.priority, dead.key) == (Status.DEAD, 8, "tenant-1")
    [replayed] = client.replay_dead(["f1"])
    assert (replayed.priority, replayed.key, replayed.shard) == (8, "tenant-1", shard_of("tenant-1", SHARDS))
    assert stored(kstore, "f1") == (8, "tenant-1", replayed.shard)
    found = fired_in_window(kstore, T0_MS, clock.now_ms(), kind="ok")
    [spec] = specs(found, (T0_MS, clock.now_ms()))
    assert (spec.priority, spec.key) == (1, "tenant-2")
    [again] = client.schedule_many([spec])
    assert (again.priority, again.key, again.shard) == (1, "tenant-2", shard_of("tenant-2", SHARDS))


def test_recurring_occurrences_inherit_priority_and_key(kstore, clock, make_client):
    client = make_client(kstore, clock=clock)
    s = client.recurring.create("nightly", kind="k", every="10s", priority=1, key="batch")
    assert (s.priority, s.key) == (1, "batch")
    got = client.recurring.get("nightly")
    assert (got.priority, got.key) == (1, "batch")
    assert client.recurring.view(got)["priority"] == 1 and client.recurring.view(got)["key"] == "batch"
    first = [j for j in kstore.get_many([f"recurring:nightly:1:{T0_MS}"]).values()]
    assert [(j.priority, j.key, j.shard) for j in first] == [(1, "batch", shard_of("batch", SHARDS))]
    # The same definition again is a no-op; another priority is another definition.
    assert client.recurring.create("nightly", kind="k", every="10s", priority=1, key="batch").version == 1
    up = client.recurring.update("nightly", priority=7, key=None)
    assert (up.version, up.priority, up.key) == (2, 7, None)
    second = kstore.get_many([f"recurring:nightly:2:{T0_MS}"])
    assert [(j.priority, j.key) for j in second.values()] == [(7, None)]
    with pytest.raises(InvalidInput):
        client.recurring.update("nightly", priority=10)
    with pytest.raises(InvalidInput):
        client.recurring.create("other", kind="k", every="10s", key="")
    assert client.recurring.get("nightly").version == 2
    assert [x.schedule_id for x in client.recurring.list()] == ["nightly"]


def test_the_poller_writes_each_next_occurrence_with_the_schedule_priority_and_key(kstore, clock):
    client = Client(kstore, clock=clock)
    seen: list[tuple[int, str | None, int]] = []
    client.recurring.create("tick", kind="tick", every="5s", priority=3, key="acct-1")
    poller = make_poller(kstore, clock, lambda job: seen.append((job.priority, job.key, job.shard)),
                         shards=range(SHARDS))
    drive(poller, clock, 21)
    assert len(seen) >= 3
    assert set(seen) == {(3, "acct-1", shard_of("acct-1", SHARDS))}


# --- upgrade ------------------------------------------------------------------------------


def _write_v006_rows(store: Store, store_kind: str, tmp_path: Any) -> None:
    """A job (both rows) and a schedule as a v006 scheduler wrote them: no priority or key."""
    fire = T0_MS + 300_000
    bucket = (fire // 60_000) * 60
    shard = shard_of("old", SHARDS)
    if store_kind == "sqlite":
        db = sqlite3.connect(f"{tmp_path}/store.db")
        with db:
            db.execute("INSERT INTO jobs_by_bucket (bucket, shard, fire_at, job_id, due_at, kind, "
                       "payload, payload_json, attempts, expires_at) "
                       "VALUES (?, ?, ?, 'old', ?, 'k', X'6E756C6C', 1, 0, ?)",
                       (bucket, shard, fire, fire, 2**62))
            db.execute("INSERT INTO jobs (job_id, kind, payload, payload_json, due_at, fire_at, bucket, "
                       "shard, status, attempts, expires_at) VALUES ('old', 'k', X'6E756C6C', 1, ?, ?, ?, ?, "
                       "'pending', 0, ?)", (fire, fire, bucket, shard, 2**62))
            db.execute("INSERT INTO schedules (schedule_id, version, state, kind, payload, payload_json, "
                       "every_s, tz, anchor_ms, overlap, misfire, catchup_window_s, jitter_s, created_ms, "
                       "updated_ms) VALUES ('olds', 1, 'active', 'k', X'6E756C6C', 1, 60, 'UTC', ?, 'allow', "
                       "'fire_once', 3600, 0, ?, ?)", (T0_MS, T0_MS, T0_MS))
        db.close()
        return
    ks, session = store.keyspace, store.session  # type: ignore[attr-defined]
    at = from_ms(fire)
    session.execute(f"INSERT INTO {ks}.jobs_by_bucket (bucket, shard, fire_at, job_id, due_at, kind, "
                    "payload, payload_json, attempts) "
                    "VALUES (%s, %s, %s, 'old', %s, 'k', 0x6E756C6C, true, 0)",
                    (bucket, shard, at, at))
    session.execute(f"INSERT INTO {ks}.jobs (job_id, kind, payload, payload_json, due_at, fire_at, bucket, "
                    "shard, status, attempts) VALUES ('old', 'k', 0x6E756C6C, true, %s, %s, %s, %s, "
                    "'pending', 0)", (at, at, bucket, shard))
    session.execute(f"INSERT INTO {ks}.schedules (schedule_id, version, state, kind, payload, payload_json, "
                    "every_s, tz, anchor_ms, overlap, misfire, catchup_window_s, jitter_s, created_ms, "
                    "updated_ms) VALUES ('olds', 1, 'active', 'k', 0x6E756C6C, true, 60, 'UTC', %s, "
                    "'allow', 'fire_once', 3600, 0, %s, %s)", (T0_MS, T0_MS, T0_MS))


def test_rows_of_a_v006_store_read_with_the_defaults_after_upgrade(store_kind, request, tmp_path, clock):
    st6 = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=SHARDS, upto=6),
                     now_ms=T0_MS - 60_000)
    try:
        assert st6.meta().schema_version == 6
        _write_v006_rows(st6, store_kind, tmp_path)
        # Code of v007 on a v006 store: one error naming the fix, for reads and writes alike.
        early = Client(st6, clock=clock)
        for call in (lambda: early.get("old"),
                     lambda: early.schedule("early", T0 + timedelta(minutes=5), "k"),
                     lambda: st6.read_bucket(0, 0, None, 2**62, 10)):
            with pytest.raises(SchemaError, match="schema apply"):
                call()
        early.close()
        res = st6.apply_schema(SchemaOptions(shard_count=SHARDS), T0_MS)
        assert (res.from_version, res.to_version, res.created) == (6, SCHEMA_VERSION, False)
        assert st6.meta().schema_version == SCHEMA_VERSION
        assert st6.apply_schema(SchemaOptions(shard_count=SHARDS), T0_MS).from_version == SCHEMA_VERSION
        assert stored(st6, "old") == (5, None, shard_of("old", SHARDS))
        [sched] = st6.list_schedules()
        assert (sched.schedule_id, sched.priority, sched.key) == ("olds", 5, None)
        client = Client(st6, clock=clock)
        moved = client.reschedule("old", T0 + timedelta(minutes=20))
        assert (moved.priority, moved.key) == (5, None)
        client.schedule("new", T0 + timedelta(minutes=5), "k", priority=9, key="c")
        assert stored(st6, "new") == (9, "c", shard_of("c", SHARDS))
        assert st6.get("early") is None  # refused before the upgrade: never written
        client.close()
    finally:
        st6.close()
