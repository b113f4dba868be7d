"""Job keys: the contract every producer and poller, in any language, must share.

- bucket: the fire time truncated to the bucket width, as Unix epoch seconds of the
  bucket's start (``floor(epoch_ms / (width_s * 1000)) * width_s``).
- shard: murmur3 x86 32-bit, seed 0, unsigned, of the job's *placement key*'s UTF-8
  bytes, modulo S, where S is the shard count in force for that bucket. The placement
  key is the job's ``key`` when it has one (a customer, an account: the unit of per-key
  concurrency and fairness), else its id. So every job of one key is in the same shard
  of a bucket, and the one poller that owns that shard sees all of them; a job without a
  key is placed exactly as before keys existed. A key and an id that are the same text
  land in the same shard (the hash does not tell them apart).
- partition key: ``(bucket, shard)``; rows within a partition are ordered by
  ``(fire_at, job_id)``.

Pure functions, no I/O; test vectors live in ``tests/unit/test_keys.py`` and in
``docs/keys-vectors.json``.
"""

from __future__ import annotations

from datetime import UTC, datetime

import mmh3

DEFAULT_BUCKET_WIDTH_S = 60
DEFAULT_SHARD_COUNT = 16


def to_ms(dt: datetime) -> int:
    """Epoch milliseconds of an aware datetime (floor for sub-millisecond parts)."""
    delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def from_ms(ms: int) -> datetime:
    """The aware UTC datetime of epoch milliseconds."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).replace(
        microsecond=(ms % 1000) * 1000
    )


def bucket_of_ms(epoch_ms: int, width_s: int) -> int:
    """Start of the bucket holding ``epoch_ms``, in epoch seconds."""
    return (epoch_ms // (width_s * 1000)) * width_s


def bucket_of(dt: datetime, width_s: int = DEFAULT_BUCKET_WIDTH_S) -> int:
    """Start of the bucket holding the aware datetime ``dt``, in epoch seconds."""
    return bucket_of_ms(to_ms(dt), width_s)


def job_hash(job_id: str) -> int:
    """Unsigned murmur3 x86 32-bit, seed 0, of the job id's UTF-8 bytes."""
    return int(mmh3.hash(job_id.encode("utf-8"), 0, signed=False))


def shard_of(job_id: str, shard_count: int) -> int:
    """Shard of ``job_id`` when ``shard_count`` shards are in force."""
    return job_hash(job_id) % shard_count


def shard_key(job_id: str, key: str | None, shard_count: int) -> int:
    """Shard of a job with ``key`` (or none) when ``shard_count`` shards are in force: the
    key's shard when the job has a key, else the id's (``shard_of``)."""
    return job_hash(job_id if key is None else key) % shard_count


def jitter_ms(job_id: str, window_s: float) -> int:
    """A deterministic offset in ``[0, window_s]`` seconds (ms), from murmur3 seed 1.

    Deterministic so that retrying a ``schedule`` call places the job identically.
    """
    window_ms = int(window_s * 1000)
    if window_ms <= 0:
        return 0
    return int(mmh3.hash(job_id.encode("utf-8"), 1, signed=False)) % (window_ms + 1)
