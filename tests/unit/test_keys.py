"""The key contract, checked against the published vectors in docs/keys-vectors.json."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import mmh3
import pytest

from scheduler.domain.keys import (
    bucket_of,
    bucket_of_ms,
    from_ms,
    jitter_ms,
    job_hash,
    shard_key,
    shard_of,
    to_ms,
)

VECTORS = json.loads((Path(__file__).parents[2] / "docs" / "keys-vectors.json").read_text("utf-8"))


@pytest.mark.parametrize("vec", VECTORS["shards"], ids=lambda v: v["job_id"][:20] or "empty")
def test_shard_vectors(vec):
    assert job_hash(vec["job_id"]) == vec["murmur3_x86_32_seed0_unsigned"]
    for count, shard in vec.get("shard", {}).items():
        assert shard_of(vec["job_id"], int(count)) == shard


@pytest.mark.parametrize("vec", VECTORS["keyed_shards"], ids=lambda v: f"{v['job_id']}|{v['key']}")
def test_keyed_shard_vectors(vec):
    # The placement key is the job's key when it has one, else its id.
    placed_by = vec["job_id"] if vec["key"] is None else vec["key"]
    assert mmh3.hash(placed_by.encode("utf-8"), 0, signed=False) == vec["murmur3_x86_32_seed0_unsigned"]
    for count, shard in vec["shard"].items():
        assert shard_key(vec["job_id"], vec["key"], int(count)) == shard


def test_every_job_of_a_key_is_in_the_key_shard():
    for count in (1, 7, 16, 1024):
        shards = {shard_key(f"order-{i}", "customer-42", count) for i in range(200)}
        assert shards == {shard_of("customer-42", count)}
        # Without a key, the same ids spread as before keys existed.
        assert all(shard_key(f"order-{i}", None, count) == shard_of(f"order-{i}", count)
                   for i in range(200))
    assert len({shard_key(f"order-{i}", None, 16) for i in range(200)}) == 16


def test_the_vectors_file_states_the_keyed_contract():
    assert "placement key is the job's key when it has one" in VECTORS["description"]
    keyed = [v for v in VECTORS["keyed_shards"] if v["key"] is not None]
    assert len({v["key"] for v in keyed}) < len(keyed)  # one key with two ids
    assert any(v["key"] is None for v in VECTORS["keyed_shards"])


def test_known_murmur3_reference_values():
    # Independent of our vectors: published MurmurHash3_x86_32 outputs with seed 0.
    assert job_hash("hello") == 0x248BFA47
    assert job_hash("The quick brown fox jumps over the lazy dog") == 0x2E4FF723


def test_shard_is_the_issue_formula():
    for job_id in ("a", "b", "héllo", "🙂" * 10):
        assert shard_of(job_id, 16) == mmh3.hash(job_id.encode("utf-8"), 0, signed=False) % 16


@pytest.mark.parametrize("vec", VECTORS["buckets"], ids=lambda v: v["time"])
def test_bucket_vectors(vec):
    dt = datetime.fromisoformat(vec["time"].replace("Z", "+00:00"))
    assert to_ms(dt) == vec["epoch_ms"]
    for width, bucket in vec["bucket"].items():
        assert bucket_of(dt, int(width)) == bucket
        assert bucket_of_ms(vec["epoch_ms"], int(width)) == bucket


def test_bucket_ignores_the_offset_of_the_input():
    utc = datetime(2027, 3, 1, 9, 0, 37, tzinfo=UTC)
    paris = utc.astimezone(timezone(timedelta(hours=1)))
    assert bucket_of(utc) == bucket_of(paris) == 1803891600


def test_ms_round_trip():
    for ms in (0, 1, 999, 1_803_978_037_123, -500):
        assert to_ms(from_ms(ms)) == ms


def test_jitter_is_deterministic_and_bounded():
    assert jitter_ms("x", 0) == 0
    values = {jitter_ms(f"job-{i}", 10) for i in range(500)}
    assert all(0 <= v <= 10_000 for v in values)
    assert len(values) > 400
    assert jitter_ms("job-1", 10) == jitter_ms("job-1", 10)
