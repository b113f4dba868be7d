"""The poller's side of the store contract: fenced checkpoints, fire records, retries,
dead letters. Same tests on SQLite and Cassandra."""

from __future__ import annotations

import pytest

from scheduler.domain.keys import bucket_of_ms
from scheduler.domain.model import Job, Status
from scheduler.domain.progress import Checkpoint
from scheduler.errors import OwnershipLost
from scheduler.store import Store

T0_MS = 1_800_000_000_000
B0 = T0_MS // 1000


def job(job_id: str, fire_ms: int = T0_MS + 5_000, shard: int = 0) -> Job:
    return Job(job_id=job_id, kind="k", data=b'{"a":1}', data_json=True, due_ms=fire_ms,
               fire_ms=fire_ms, bucket=bucket_of_ms(fire_ms, 60), shard=shard)


def test_claim_creates_then_fences(store: Store):
    cp = store.claim_shard(3, "p1", 10, B0 - 60, T0_MS)
    assert cp == Checkpoint(B0 - 60)
    store.save_checkpoint(3, 10, Checkpoint(B0, (T0_MS + 61_000, "x")), T0_MS)
    # A newer owner takes over and sees the saved state.
    assert store.claim_shard(3, "p2", 11, B0 - 60, T0_MS) == Checkpoint(B0, (T0_MS + 61_000, "x"))
    with pytest.raises(OwnershipLost):
        store.save_checkpoint(3, 10, Checkpoint(B0 + 60), T0_MS)
    with pytest.raises(OwnershipLost, match="held by p2 with epoch 11"):
        store.claim_shard(3, "p1", 10, B0 - 60, T0_MS)
    # Re-claiming with the same epoch is a no-op; another owner with an equal epoch loses.
    assert store.claim_shard(3, "p2", 11, B0 - 60, T0_MS).drained == B0
    with pytest.raises(OwnershipLost):
        store.claim_shard(3, "p3", 11, B0 - 60, T0_MS)
    rows = {c.shard: c for c in store.checkpoints()}
    assert rows[3].owner == "p2" and rows[3].owner_epoch == 11 and rows[3].drained == B0


def test_checkpoint_never_moves_backwards(store: Store):
    store.claim_shard(0, "p", 5, B0, T0_MS)
    store.save_checkpoint(0, 5, Checkpoint(B0 + 120), T0_MS)
    store.save_checkpoint(0, 5, Checkpoint(B0 + 60), T0_MS)  # refused silently: not a fencing issue
    assert store.claim_shard(0, "p", 5, B0, T0_MS).drained == B0 + 120


def test_release_clears_the_owner_only_for_its_epoch(store: Store):
    store.claim_shard(1, "p", 5, B0, T0_MS)
    assert store.release_shard(1, 4, T0_MS) is False  # fenced
    assert {c.shard: c.owner for c in store.checkpoints()}[1] == "p"
    assert store.release_shard(1, 5, T0_MS) is True
    assert {c.shard: c.owner for c in store.checkpoints()}[1] is None


CLOCK_TOKEN = 1_796_465_640_485_238_045  # a token counted from the clock (a run without ZooKeeper)


def test_a_released_shard_is_taken_at_a_lower_epoch_only_while_still_released(store: Store):
    store.claim_shard(2, "solo", CLOCK_TOKEN, B0, T0_MS)
    with pytest.raises(OwnershipLost):  # held: never taken, whatever epoch was seen
        store.take_released_shard(2, "zk", 77, CLOCK_TOKEN, T0_MS)
    assert store.release_shard(2, CLOCK_TOKEN, T0_MS) is True
    with pytest.raises(OwnershipLost, match=f"held by None with epoch {CLOCK_TOKEN}") as refused:
        store.claim_shard(2, "zk", 77, B0, T0_MS)  # the fence refuses a lower token, as before
    assert (refused.value.holder, refused.value.held_epoch) == (None, CLOCK_TOKEN)  # what the fence read
    with pytest.raises(OwnershipLost):  # released, but not at the epoch the claimer saw
        store.take_released_shard(2, "zk", 77, CLOCK_TOKEN - 1, T0_MS)
    assert store.take_released_shard(2, "zk", 77, CLOCK_TOKEN, T0_MS) == Checkpoint(B0)
    rows = {c.shard: c for c in store.checkpoints()}
    assert rows[2].owner == "zk" and rows[2].owner_epoch == 77
    # The fence orders the new tokens again: a newer one takes over, the older is refused.
    assert store.claim_shard(2, "zk2", 78, B0, T0_MS) == Checkpoint(B0)
    with pytest.raises(OwnershipLost):
        store.save_checkpoint(2, 77, Checkpoint(B0 + 60), T0_MS)
    with pytest.raises(OwnershipLost):  # taken by a newer token since: not released any more
        store.take_released_shard(2, "zk", 77, 78, T0_MS)


def test_fired_retry_and_dead(store: Store):
    a, b, c = job("a"), job("b"), job("c")
    store.insert_many([a, b, c])
    store.record_fired([a], T0_MS + 5_010)
    got = store.get("a")
    assert got is not None and got.status is Status.FIRED and got.fired_ms == T0_MS + 5_010
    assert got.attempts == 1

    retry = job("b", fire_ms=T0_MS + 65_000).evolve(attempts=1)
    store.record_retry(b, retry, "boom", T0_MS + 5_020)
    got = store.get("b")
    assert got is not None and got.status is Status.PENDING and got.attempts == 1
    assert got.last_error == "boom" and got.fire_ms == T0_MS + 65_000 and got.fired_ms == T0_MS + 5_020
    rows = store.read_bucket(retry.bucket, 0, None, 2**62, 10)
    assert [(r.job_id, r.attempts, r.fired_ms) for r in rows] == [("b", 1, None)]
    # The first attempt's row is marked, so a new owner re-reading it skips it.
    first = store.read_bucket(b.bucket, 0, None, 2**62, 10)
    assert {r.job_id: r.status for r in first} == {"a": Status.FIRED, "b": Status.FIRED,
                                                    "c": Status.PENDING}

    store.record_dead(c, "no handler for kind 'k'", T0_MS)
    got = store.get("c")
    assert got is not None and got.status is Status.DEAD and got.last_error == "no handler for kind 'k'"
    dead = store.dead_letters()
    assert [(d.job_id, d.attempts, d.error) for d in dead] == [("c", 1, "no handler for kind 'k'")]
    store.delete_dead_letter("c")
    assert store.dead_letters() == []
