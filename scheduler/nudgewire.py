"""The wire format of nudges (the due-now fast path: ``scheduler/nudger.py`` sends them,
``scheduler/poller/nudge.py`` receives them). Pure.

A datagram is JSON: ``{"v": 1, "j": [[shard, bucket, fire_ms, job_id], ...]}``, each entry
the key of a bucket row a producer just wrote.

Datagrams arrive unauthenticated from anyone who reaches the socket, so ``decode`` is
written for hostile input: a size limit before any parsing, JSON nesting errors turned
into ``ValueError``, integers that are real integers (not ``true``, not ``1.0``) within
the ranges the stores hold (a Cassandra ``bigint``; shards below the largest shard
count), job ids the store could hold, and a bounded number of entries.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from .errors import InvalidInput
from .layout import MAX_SHARD_COUNT
from .model import check_job_id

# Datagrams stay under a typical path MTU: no fragmentation across a network.
DATAGRAM_BYTES = 1200
# What ``decode`` reads at most: room for another producer's formatting (spaces), and
# small enough that parsing costs next to nothing.
MAX_DATAGRAM_BYTES = 2 * DATAGRAM_BYTES
# Entries per datagram at most. ``encode`` fits at most ~100 (the smallest entry,
# ``[0,0,0,"a"]``, is 12 bytes with its comma).
MAX_ENTRIES = 128
INT64_MAX = 2**63 - 1
# (shard, bucket, fire_ms, job_id): the bucket row a producer wrote.
Entry = tuple[int, int, int, str]


def encode(entries: Iterable[Entry]) -> list[bytes]:
    """Datagrams carrying ``entries``, each at most ``DATAGRAM_BYTES`` and ``MAX_ENTRIES``
    entries (an entry alone over the size is dropped: its job takes the usual path)."""
    out: list[bytes] = []
    batch: list[str] = []
    size = 0
    for e in entries:
        item = json.dumps(list(e), separators=(",", ":"))
        if batch and (size + len(item) + 1 > DATAGRAM_BYTES - 16 or len(batch) >= MAX_ENTRIES):
            out.append(('{"v":1,"j":[' + ",".join(batch) + "]}").encode())
            batch, size = [], 0
        if len(item) + 16 <= DATAGRAM_BYTES:
            batch.append(item)
            size += len(item) + 1
    if batch:
        out.append(('{"v":1,"j":[' + ",".join(batch) + "]}").encode())
    return out


def decode(data: bytes) -> list[Entry]:
    """The entries of a datagram, each valid by ``check_entry``. Raises ``ValueError``
    (and nothing else) for anything that is not a whole, valid nudge: one bad entry
    rejects the datagram."""
    if len(data) > MAX_DATAGRAM_BYTES:
        raise ValueError(f"{len(data)} bytes; a nudge has at most {MAX_DATAGRAM_BYTES}")
    try:
        msg = json.loads(data)
    except RecursionError:  # "[[[[..." nested deeper than the interpreter's stack
        raise ValueError("JSON nested too deep") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, too many digits
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(msg, dict) or not _is_int(msg.get("v")) or msg["v"] != 1:
        raise ValueError("not a nudge (no version 1)")
    items = msg.get("j")
    if not isinstance(items, list):
        raise ValueError("not a nudge (no entry list)")
    if len(items) > MAX_ENTRIES:
        raise ValueError(f"{len(items)} entries; a nudge has at most {MAX_ENTRIES}")
    return [check_entry(e) for e in items]


def check_entry(e: object) -> Entry:
    """``e`` as an entry, or ``ValueError``: a list or tuple of four, an int shard in
    ``[0, MAX_SHARD_COUNT)``, an int bucket and fire time in ``[0, 2**63)`` (never a
    bool), and a job id a producer accepts (``check_job_id``: a non-empty string of at
    most ``MAX_JOB_ID_BYTES`` of UTF-8, so no lone surrogate)."""
    if not isinstance(e, list | tuple) or len(e) != 4:
        raise ValueError("bad entry: not [shard, bucket, fire_ms, job_id]")
    shard, bucket, fire_ms, job_id = e
    if not _is_int(shard) or not 0 <= shard < MAX_SHARD_COUNT:
        raise ValueError(f"bad entry: shard {shard!r:.40} is not an int in [0, {MAX_SHARD_COUNT})")
    for name, value in (("bucket", bucket), ("fire_ms", fire_ms)):
        if not _is_int(value) or not 0 <= value <= INT64_MAX:
            raise ValueError(f"bad entry: {name} {value!r:.40} is not an int in [0, 2**63)")
    try:
        # What a producer accepts as an id is all it can nudge: an occurrence of a
        # recurring schedule is refused too (its rows are the poller's own, never nudged).
        check_job_id(job_id)
    except InvalidInput as exc:
        raise ValueError(f"bad entry: {exc}") from None
    return (shard, bucket, fire_ms, job_id)


def _is_int(value: object) -> bool:
    # Not isinstance: True and False are ints to Python, and ``true`` is not a shard.
    return type(value) is int


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)
