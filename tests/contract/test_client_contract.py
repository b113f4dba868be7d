"""One contract suite, run against the embedded store and a real Cassandra.

The clock is injected: a FakeClock at a fixed wall time, so placement is exact.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from scheduler import InvalidInput, Job, JobNotFound, JobSpec, Status
from scheduler.domain.clock import FakeClock
from scheduler.domain.keys import bucket_of, from_ms, shard_of
from scheduler.domain.layout import MARK_SPAN_S
from scheduler.errors import ConfigError, ResizeRefused
from scheduler.store import Store

T0_MS = 1_800_000_000_000  # 2027-01-15T08:00:00Z, a bucket boundary
T0 = from_ms(T0_MS)


@pytest.fixture(params=["sqlite", "cassandra", "secure"])
def store_kind(request) -> str:
    """The producer contract also runs on the secured stack (passwords, TLS), as the
    least-privileged app role."""
    return str(request.param)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0_MS)


@pytest.fixture
def client(store: Store, clock: FakeClock, make_client):
    """Each test runs with ``Client`` and with ``AsyncClient`` (see ``make_client``)."""
    return make_client(store, clock=clock)


def pending(store: Store, bucket: int, shard: int) -> list[Job]:
    """The rows a poller would fire: a cancelled or moved job's row stays, marked done
    (no tombstone in an open bucket), until it expires."""
    return [r for r in store.read_bucket(bucket, shard, None, 2**62, 10_000) if r.status is Status.PENDING]


def bucket_ids(store: Store, job) -> list[str]:
    return [r.job_id for r in pending(store, job.bucket, job.shard)]


def test_schedule_places_and_stores(client, store):
    due = T0 + timedelta(hours=3, seconds=37)
    job = client.schedule("job-1", due, "email", {"to": "a@example.com"})
    assert job.due_at == due and job.fire_at == due
    assert job.bucket == bucket_of(due) and job.bucket % 60 == 0
    assert job.shard == shard_of("job-1", 16)
    assert job.status is Status.PENDING and job.attempts == 0
    got = client.get("job-1")
    assert got == job
    assert got.payload == {"to": "a@example.com"}
    assert bucket_ids(store, job) == ["job-1"]


def test_bytes_payload_round_trips(client):
    client.schedule("bin", T0 + timedelta(hours=1), "blob", b"\x00\xff")
    assert client.get("bin").payload == b"\x00\xff"


def test_same_id_same_due_changes_nothing(client, store):
    due = T0 + timedelta(hours=1)
    first = client.schedule("idem", due, "email", {"v": 1})
    again = client.schedule("idem", due, "email", {"v": 2})
    assert again == first and client.get("idem").payload == {"v": 1}
    assert bucket_ids(store, first) == ["idem"]


def test_same_id_new_due_is_a_reschedule(client, store):
    first = client.schedule("move", T0 + timedelta(hours=1), "email", {"v": 1})
    second = client.schedule("move", T0 + timedelta(hours=2), "email", {"v": 2})
    assert second.due_at == T0 + timedelta(hours=2)
    assert bucket_ids(store, first) == []
    assert bucket_ids(store, second) == ["move"]
    assert client.get("move").payload == {"v": 2}


def test_late_write_goes_ahead_of_every_reader(client, store, clock):
    margin = client.meta.late_margin_ms
    due = T0 - timedelta(minutes=5)
    job = client.schedule("late", due, "email")
    assert job.due_at == due, "a late job keeps its due time for lateness accounting"
    assert job.fire_ms == T0_MS + margin
    assert job.bucket == bucket_of(from_ms(T0_MS + margin))
    # Due a moment from now, inside the margin: also pushed to now + margin.
    soon = client.schedule("soon", T0 + timedelta(milliseconds=margin // 2), "email")
    assert soon.fire_ms == T0_MS + margin


def test_jitter_spreads_within_the_window(client):
    due = T0 + timedelta(hours=1)
    jobs = [client.schedule(f"j{i}", due, "email", jitter_s=30) for i in range(20)]
    offsets = {j.fire_ms - j.due_ms for j in jobs}
    assert all(0 <= o <= 30_000 for o in offsets) and len(offsets) > 10
    assert all(j.due_at == due for j in jobs)


def test_cancel(client, store):
    job = client.schedule("c1", T0 + timedelta(hours=1), "email")
    assert client.cancel("c1") is True
    assert client.get("c1").status is Status.CANCELLED
    assert bucket_ids(store, job) == []
    assert client.cancel("c1") is False
    assert client.cancel("never-scheduled") is False


def test_reschedule(client, store):
    old = client.schedule("r1", T0 + timedelta(hours=1), "email", {"k": 1})
    new = client.reschedule("r1", T0 + timedelta(hours=5))
    assert new.due_at == T0 + timedelta(hours=5) and new.payload == {"k": 1}
    assert bucket_ids(store, old) == [] and bucket_ids(store, new) == ["r1"]
    with pytest.raises(JobNotFound):
        client.reschedule("missing", T0 + timedelta(hours=1))


def test_reschedule_rearms_a_cancelled_job(client):
    client.schedule("r2", T0 + timedelta(hours=1), "email")
    client.cancel("r2")
    again = client.reschedule("r2", T0 + timedelta(hours=2))
    assert again.status is Status.PENDING
    assert client.get("r2").status is Status.PENDING


def test_get_missing_raises(client):
    with pytest.raises(JobNotFound, match="no job with id 'nope'"):
        client.get("nope")


def test_schedule_many_and_progress(client, store):
    due = T0 + timedelta(minutes=10)
    specs = [JobSpec(f"bulk-{i}", due + timedelta(seconds=i % 120), "email", {"i": i})
             for i in range(1200)]
    seen: list[int] = []
    jobs = client.schedule_many(specs, progress=seen.append)
    assert len(jobs) == 1200 and sum(seen) == 1200
    assert client.get("bulk-777").payload == {"i": 777}
    total = sum(len(store.read_bucket(b, s, None, 2**62, 10_000))
                for b in {j.bucket for j in jobs} for s in range(16))
    assert total == 1200


def test_schedule_many_accepts_json_records(client):
    jobs = client.schedule_many([{"id": "d1", "at": "2027-01-15T09:00:00Z", "kind": "k"},
                                 {"job_id": "d2", "due_at": "2027-01-15T09:00:00+01:00",
                                  "kind": "k", "payload": [1], "jitter": 5}])
    assert [j.job_id for j in jobs] == ["d1", "d2"]


@pytest.mark.parametrize("bad,match", [
    (JobSpec("", T0, "k"), "non-empty"),
    (JobSpec("x", datetime(2030, 1, 1), "k"), "no timezone"),
    (JobSpec("x", T0, "not a kind"), "short identifier"),
    (JobSpec("x", T0, "k", b"x" * 70_000), "limit is 65536"),
    (JobSpec("x", T0, "k", jitter_s=-1), "jitter"),
])
def test_bad_input_writes_nothing(client, store, bad, match):
    good = JobSpec("good-before", T0 + timedelta(hours=1), "k")
    with pytest.raises(InvalidInput, match=match):
        client.schedule_many([good, bad])
    with pytest.raises(JobNotFound):
        client.get("good-before")


def test_duplicate_ids_in_one_batch_are_refused(client):
    with pytest.raises(InvalidInput, match="more than once"):
        client.schedule_many([JobSpec("dup", T0, "k"), JobSpec("dup", T0, "k")])


def test_configured_payload_limit(store, clock, make_client):
    c = make_client(store, clock=clock, max_payload_bytes=10)
    with pytest.raises(InvalidInput, match="limit is 10 bytes"):
        c.schedule("p", T0, "k", "x" * 20)


def test_client_with_another_bucket_width_refuses(store, clock, make_client):
    with pytest.raises(ConfigError, match="60s"):
        make_client(store, clock=clock, bucket_width_s=30)


def test_resize_and_per_bucket_shard_count(client, store, clock):
    far = T0 + timedelta(days=2, seconds=13)
    before = client.schedule("far", far, "email")  # written with S=16
    assert before.shard == shard_of("far", 16)
    with pytest.raises(ResizeRefused, match="earliest allowed cutover is"):
        client.resize(4, T0)
    cutover = T0 + timedelta(hours=1)
    lay = client.resize(4, cutover)
    assert lay.shard_count == 4
    after = client.schedule("far-2", far, "email")
    assert after.shard == shard_of("far-2", 4)
    early = client.schedule("early", T0 + timedelta(minutes=30), "email")
    assert early.shard == shard_of("early", 16)
    # The reader must still cover S=16 for the far bucket, where 'far' was written.
    layouts = client.layouts(fresh=True)
    assert layouts.read_count(before.bucket) == 16
    assert layouts.read_count(bucket_of(cutover)) == 16  # written under S=16 up to 'far'
    beyond = (before.bucket // MARK_SPAN_S + 2) * MARK_SPAN_S
    assert layouts.read_count(beyond) == 4
    # Growing works the same way.
    grow = client.resize(64, T0 + timedelta(hours=2))
    assert grow.shard_count == 64
    assert client.schedule("g", T0 + timedelta(hours=3), "email").shard == shard_of("g", 64)


def test_layout_cache_is_bounded_by_its_ttl(store, clock, make_client):
    producer = make_client(store, clock=clock, layout_cache_ttl_s=30)
    admin = make_client(store, clock=clock)
    producer.schedule("warm", T0 + timedelta(hours=2), "email")
    admin.resize(2, T0 + timedelta(minutes=5))
    clock.advance(29)
    # Within the TTL the producer may use its cached layout (S=16): the cutover bound
    # makes that safe because the bucket is before the cutover...
    stale = producer.schedule("x1", T0 + timedelta(minutes=1), "email")
    assert stale.shard == shard_of("x1", 16)
    clock.advance(1)
    # ...and once the TTL has passed it must reload before writing.
    fresh = producer.schedule("x2", T0 + timedelta(minutes=10), "email")
    assert fresh.shard == shard_of("x2", 2)



class LostAcknowledgement:
    """A store whose first insert_many lands only its bucket rows (phase one of a
    Cassandra bulk write) and then times out: the job is in a bucket, yet ``get``
    does not see it."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.hidden: set[str] = set()
        self.failed = False

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def insert_many(self, jobs, progress=None):
        from scheduler.errors import WriteTimeout

        self._store.insert_many(jobs, progress)
        if not self.failed:
            self.failed = True
            self.hidden |= {j.job_id for j in jobs}
            raise WriteTimeout("writing jobs timed out and may have been applied", maybe_applied=True)
        self.hidden -= {j.job_id for j in jobs}

    def get_many(self, job_ids):
        return {k: v for k, v in self._store.get_many(job_ids).items() if k not in self.hidden}

    async def acall(self, method, *args):  # AsyncClient: this proxy's methods, inline
        return getattr(self, method)(*args)


def test_a_retried_write_of_a_near_job_leaves_one_bucket_row(store, clock, make_client):
    """A near-term job is placed at now + late margin. When its first write times out
    after its bucket row landed, a retry of the same call a moment later must not leave
    that row behind beside a new one: the job would fire twice."""
    from scheduler.errors import WriteTimeout

    client = make_client(store, clock=clock, retry_s=0)  # the caller retries, not the client
    client.store = LostAcknowledgement(store)
    with pytest.raises(WriteTimeout):
        client.schedule("near", T0, "k")
    first = store.get("near")
    assert first is not None
    clock.advance(1.0)  # the caller retries a second later
    job = client.schedule("near", T0, "k")
    rows = [(b, s) for b in {first.bucket, job.bucket} for s in {first.shard, job.shard}
            for r in pending(store, b, s) if r.job_id == "near"]
    assert len(rows) == 1, "one bucket row: the job fires once"
    assert store.get("near").fire_ms == job.fire_ms
    client.close()


def test_the_client_rides_out_a_lost_acknowledgement_itself(store, clock, make_client):
    client = make_client(store, clock=clock, retry_s=5)
    flaky = LostAcknowledgement(store)
    client.store = flaky
    job = client.schedule("near", T0, "k")
    assert flaky.failed and store.get("near").fire_ms == job.fire_ms
    assert bucket_ids(store, job) == ["near"]
    client.close()
