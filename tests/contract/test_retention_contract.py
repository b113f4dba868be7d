"""Retention on both stores: a job's rows expire a retention after it fires, is cancelled
or dies (TTLs on Cassandra, a sweep on the embedded store), and a v001 keyspace is
upgraded in place with its jobs."""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from scheduler import Client, InvalidInput, JobNotFound, JobSpec, Status
from scheduler.domain.clock import FakeClock, SystemClock
from scheduler.domain.keys import from_ms
from scheduler.store import SchemaOptions, Store
from scheduler.store.base import SCHEMA_VERSION
from scheduler.store.cassandra.store import CassandraStore
from scheduler.store.rows import bucket_params, job_params
from tests.conftest import make_store
from tests.contract.test_poller_contract import Recorder, drive, make_poller

T0_MS = 1_800_000_000_000
KEEP_S, KEEP_DEAD_S = 10, 20


def rows_of(store: Store, job_id: str, bucket: int, shard: int) -> list[Any]:
    return [r for r in store.read_bucket(bucket, shard, None, 2**62, 1000) if r.job_id == job_id]


def wait_until(ms: int) -> None:
    time.sleep(max(0.0, (ms - SystemClock().now_ms()) / 1000))


def test_rows_expire_a_retention_after_they_fire_are_cancelled_or_die(store_kind, request, tmp_path):
    store = make_store(store_kind, request, tmp_path,
                       SchemaOptions(shard_count=1, retention_s=KEEP_S, dead_retention_s=KEEP_DEAD_S))
    clock = SystemClock()
    client = Client(store, clock=clock)
    try:
        now = clock.now_ms()
        fired = client.schedule("fired", from_ms(now), "k")  # placed at now + late margin
        far = client.schedule("far", from_ms(now + 365 * 86_400_000), "k")
        cancelled = client.schedule("cancelled", from_ms(now + 3_600_000), "k")
        retried = client.schedule("retried", from_ms(now), "k")
        dead = client.schedule("dead", from_ms(now), "k")
        assert client.cancel("cancelled")
        cancelled_at = clock.now_ms()
        store.record_fired([fired], fired.fire_ms)
        retry = retried.evolve(fire_ms=retried.fire_ms + 2_000, attempts=1)
        store.record_retry(retried, retry, "boom", retried.fire_ms)
        store.record_dead(dead, "no handler", dead.fire_ms)
        assert client.get("retried").status is Status.PENDING
        assert client.get("dead").status is Status.DEAD and len(store.dead_letters()) == 1

        # Just before their expiry everything is still there.
        wait_until(min(fired.fire_ms, cancelled_at) + KEEP_S * 1000 - 3_000)
        assert client.get("fired").status is Status.FIRED
        assert client.get("cancelled").status is Status.CANCELLED

        # Retention after firing (the sweep of the embedded store runs once a second).
        wait_until(max(fired.fire_ms, cancelled_at) + KEEP_S * 1000 + 1_500)
        for job_id in ("fired", "cancelled"):
            with pytest.raises(JobNotFound, match="expired"):
                client.get(job_id)
        assert rows_of(store, "fired", fired.bucket, fired.shard) == []
        assert rows_of(store, "cancelled", cancelled.bucket, cancelled.shard) == []
        first_try = [r for r in rows_of(store, "retried", retried.bucket, retried.shard)
                     if r.fire_ms == retried.fire_ms]
        assert first_try == []
        assert client.get("far").status is Status.PENDING
        assert rows_of(store, "far", far.bucket, far.shard)[0].status is Status.PENDING
        # A dead job stays as long as its dead letter, so that it can be replayed.
        assert client.get("dead").status is Status.DEAD and len(store.dead_letters()) == 1

        wait_until(max(retry.fire_ms + KEEP_S * 1000, dead.fire_ms + KEEP_DEAD_S * 1000) + 1_500)
        with pytest.raises(JobNotFound):
            client.get("retried")
        with pytest.raises(JobNotFound):
            client.get("dead")
        assert store.dead_letters() == []
        assert client.get("far").status is Status.PENDING
    finally:
        client.close()
        store.close()


def _write_v001_jobs(store: Store, jobs: list[Any]) -> None:
    """Rows exactly as v001 code wrote them: no expiry of any kind."""
    if isinstance(store, CassandraStore):
        ks = store.keyspace
        for job in jobs:
            store.session.execute(
                f"INSERT INTO {ks}.jobs_by_bucket (bucket, shard, fire_at, job_id, due_at, kind, payload, "
                "payload_json, attempts) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)", bucket_params(job)[:9])
            store.session.execute(
                f"INSERT INTO {ks}.jobs (job_id, kind, payload, payload_json, due_at, fire_at, bucket, "
                "shard, status, attempts, fired_at, last_error) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", job_params(job)[:12])
    else:
        db = store._db  # type: ignore[attr-defined]
        db.executemany("INSERT INTO jobs_by_bucket (bucket, shard, fire_at, job_id, due_at, kind, payload, "
                       "payload_json, attempts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       [bucket_params(j)[:9] for j in jobs])  # v001 had no priority, key
        db.executemany("INSERT INTO jobs (job_id, kind, payload, payload_json, due_at, fire_at, bucket, "
                       "shard, status, attempts, fired_at, last_error) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       [job_params(j)[:12] for j in jobs])


def test_a_v001_keyspace_is_upgraded_in_place_and_its_jobs_still_fire(store_kind, request, tmp_path):
    store = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=4, upto=1),
                       now_ms=T0_MS - 60_000)
    clock = FakeClock(T0_MS)
    try:
        assert store.meta().schema_version == 1
        client = Client(store, clock=clock)
        jobs = [client.build(JobSpec(f"old-{i}", from_ms(T0_MS + 5_000 + i * 50), "k")) for i in range(40)]
        _write_v001_jobs(store, jobs)

        res = store.apply_schema(SchemaOptions(shard_count=4), T0_MS)
        assert (res.from_version, res.to_version) == (1, SCHEMA_VERSION) and not res.created
        assert res.meta.retention_s == 7 * 86_400 and res.meta.dead_retention_s == 30 * 86_400
        assert all(client.get(j.job_id).status is Status.PENDING for j in jobs)
        new = client.schedule("new", from_ms(T0_MS + 6_000), "k")
        assert client.recurring.list() == []  # v002's tables exist too

        rec = Recorder(clock)
        drive(make_poller(store, clock, rec), clock, 15)
        fired = Counter(c[0] for c in rec.calls)
        assert set(fired) == {j.job_id for j in jobs} | {new.job_id} and max(fired.values()) == 1
        assert client.get("old-7").status is Status.FIRED
        client.close()
    finally:
        store.close()


def test_retention_can_be_changed_later(store_kind, request, tmp_path):
    store = make_store(store_kind, request, tmp_path, SchemaOptions(retention_s=3_600))
    try:
        assert store.retention.jobs_s == 3_600
        same = store.apply_schema(SchemaOptions(retention_s=3_600), T0_MS)
        assert same.retention_was is None
        res = store.apply_schema(SchemaOptions(retention_s=86_400, dead_retention_s=60), T0_MS)
        assert res.retention_was is not None and res.retention_was.jobs_s == 3_600
        assert (res.meta.retention_s, res.meta.dead_retention_s) == (86_400, 60)
        assert store.retention.jobs_s == 86_400
        # Not given: kept.
        assert store.apply_schema(SchemaOptions(), T0_MS).meta.retention_s == 86_400
    finally:
        store.close()


def test_a_job_past_the_last_storable_expiry_is_refused(store):
    client = Client(store, clock=FakeClock(T0_MS))
    try:
        client.schedule("ok", from_ms(T0_MS) + timedelta(days=3_650), "k")
        with pytest.raises(InvalidInput, match="too far ahead"):
            client.schedule("too-far", from_ms(2_147_483_000_000), "k")
        with pytest.raises(JobNotFound):
            client.get("too-far")
    finally:
        client.close()
