"""Per-shard drain progress: what to read next, and how far the shard is drained.
Pure: the poller feeds it reads and completions; it answers with checkpoints.

State, for one shard:

- ``drained``: the checkpoint, the last bucket whose every row is complete.
- ``read_bucket`` / ``read_cursor``: where the next read starts (strictly after the
  cursor). Buckets before ``read_bucket`` are *closed*: fully read by a read issued when
  the bucket was already in the past, so no write can land in them any more (see the
  late-write rule in ``scheduler.producer.producer``).
- ``done_cursor``: inside bucket ``drained + width``, every row up to this key is
  complete. It is saved with the checkpoint, so a new owner resumes there and re-fires at
  most the rows that were in flight.

A row is *complete* once it was fired and recorded, retried or dead-lettered.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

Key = tuple[int, str]  # (fire_ms, job_id): the clustering order inside a bucket


@dataclass(frozen=True)
class Checkpoint:
    """What is persisted for a shard."""

    drained: int
    done_cursor: Key | None = None


# A handed-out row: [bucket, key, complete?]. A plain list: the poller makes one per row
# read, and a list is several times cheaper to build than an object.
_BUCKET, _KEY, _DONE = 0, 1, 2


class ShardProgress:
    def __init__(self, shard: int, width_s: int, checkpoint: Checkpoint) -> None:
        self.shard = shard
        self.width_s = width_s
        self.drained = checkpoint.drained
        self.read_bucket = checkpoint.drained + width_s
        self.read_cursor: Key | None = checkpoint.done_cursor
        # The last complete position: (bucket, key).
        self._done: tuple[int, Key] | None = (
            (self.read_bucket, checkpoint.done_cursor) if checkpoint.done_cursor else None)
        # Rows handed out, in read order; indexed by key, unique within a shard.
        self._rows: deque[list[Any]] = deque()
        self._index: dict[Key, list[Any]] = {}
        # Rows handed out *ahead* of the cursor (due-now jobs a producer pointed us to,
        # ``take_early``), by key, until the cursor reads them.
        self._early: dict[Key, list[Any]] = {}

    @property
    def in_flight(self) -> int:
        return len(self._index)

    def bucket_end_ms(self, bucket: int) -> int:
        return (bucket + self.width_s) * 1000

    def next_read(self, horizon_ms: int) -> tuple[int, Key | None, int] | None:
        """``(bucket, after, until_ms)`` for the next read, or None when the next bucket
        starts after the horizon (nothing to read yet)."""
        if self.read_bucket * 1000 > horizon_ms:
            return None
        until = min(horizon_ms, self.bucket_end_ms(self.read_bucket) - 1)
        return self.read_bucket, self.read_cursor, until

    def on_read(self, bucket: int, keys: list[Key], full: bool, issued_at_ms: int) -> bool:
        """Record a read of ``read_bucket`` issued at ``issued_at_ms`` (poller clock) that
        returned ``keys`` in order; an empty, non-full read of a shard the bucket's layout
        does not have is recorded the same way.

        Returns True when the caller should read again at once: the page was full, or
        the bucket just closed and the next one may already be readable.
        """
        if bucket != self.read_bucket:
            raise ValueError(f"read of bucket {bucket} while reading {self.read_bucket}")
        rows, index, early = self._rows, self._index, self._early
        for key in keys:
            taken = early.pop(key, None) if early else None
            if taken is not None:
                rows.append(taken)
                if not taken[_DONE]:
                    index[key] = taken
                continue
            row = [bucket, key, False]
            rows.append(row)
            index[key] = row
        if keys:
            self.read_cursor = keys[-1]
        if full:
            return True
        if issued_at_ms >= self.bucket_end_ms(bucket):
            # Read entirely after the bucket ended: nothing can land in it any more.
            self.read_bucket += self.width_s
            self.read_cursor = None
            return True
        return False

    def complete(self, bucket: int, key: Key) -> None:
        """Mark a handed-out row complete (idempotent; unknown rows are ignored)."""
        row = self._index.pop(key, None) or self._early.get(key)
        if row is not None:
            row[_DONE] = True

    def take_early(self, bucket: int, key: Key) -> bool:
        """Hand out a row ahead of the cursor; False when the cursor has read it already
        (it is handed out, or complete) or it was taken before. The cursor still reads
        it later: ``on_read`` then tracks it like any row read (the checkpoint cannot pass
        it while it is incomplete) and reports it in ``early_keys`` so it is not queued
        twice."""
        if key in self._early or bucket < self.read_bucket:
            return False
        if bucket == self.read_bucket and self.read_cursor is not None and key <= self.read_cursor:
            return False
        self._early[key] = [bucket, key, False]
        return True

    def holds(self, key: Key) -> bool:
        """Whether ``key`` is a position this progress has handed out (read, or taken
        early) and not yet passed: a row written there now would be counted as that one."""
        return key in self._index or key in self._early

    def early_keys(self, keys: list[Key]) -> set[Key]:
        """Which of ``keys`` (a read's) were handed out early."""
        early = self._early
        return {k for k in keys if k in early} if early else set()

    def checkpoint(self) -> Checkpoint:
        """Advance past completed rows and closed buckets; return the new checkpoint.

        Every bucket before the first one with an incomplete row (or, with none, before
        ``read_bucket``) is closed and complete, so it is drained.
        """
        while self._rows and self._rows[0][_DONE]:
            row = self._rows.popleft()
            self._done = (row[_BUCKET], row[_KEY])
        first_open = self._rows[0][_BUCKET] if self._rows else self.read_bucket
        self.drained = max(self.drained, first_open - self.width_s)
        if not self._rows and self.read_cursor is not None:
            self._done = (self.read_bucket, self.read_cursor)
        cursor = self._done[1] if self._done and self._done[0] == first_open else None
        return Checkpoint(self.drained, cursor)
