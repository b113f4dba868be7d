"""The wire format of nudges (the due-now fast path: ``scheduler/nudger.py`` sends them,
``scheduler/poller/nudge.py`` receives them). Pure.

A datagram is JSON::

    {"v": 1, "j": [[shard, bucket, fire_ms, job_id], ...], "r": [[shard, bucket, fire_ms, job_id], ...]}

- ``"j"``: keys of bucket rows a producer just wrote, due now: the owner may fire them at
  their due time.
- ``"r"`` (optional): keys of bucket rows a producer just *retired* (moved or cancelled;
  the store marks them done): the owner re-reads them and drops those it still holds
  queued, once the store confirms they are retired.

``encode`` always writes ``"j"`` (an empty list when there is nothing due now), so a
poller that predates ``"r"`` reads a datagram of retired rows as an empty nudge and
ignores it; the version stays 1. A receiver accepts a datagram with ``"j"``, ``"r"`` or
both (an empty one does nothing).

Datagrams arrive unauthenticated from anyone who reaches the socket, so
``decode_message`` is written for hostile input: a size limit before any parsing, JSON
nesting errors turned into ``ValueError``, integers that are real integers (not
``true``, not ``1.0``) within the ranges the stores hold (a Cassandra ``bigint``; shards
below the largest shard count), job ids the store could hold, and a bounded number of
entries over both lists.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from itertools import chain

# Re-exported: the nudge path (poller/nudge.py, nudger.py) reads addresses with it.
from ..domain.address import parse_address as parse_address
from ..domain.layout import MAX_SHARD_COUNT
from ..domain.model import check_job_id
from ..errors import InvalidInput

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


def encode(entries: Iterable[Entry], recheck: Iterable[Entry] = ()) -> list[bytes]:
    """Datagrams carrying ``entries`` (due now, ``"j"``) and ``recheck`` (retired, ``"r"``),
    in order, each at most ``DATAGRAM_BYTES`` and ``MAX_ENTRIES`` entries over both lists;
    none when both are empty. An entry too big for a datagram of its own is dropped (a due
    job then takes the usual path; a retired row may fire once more, as without nudges)."""
    out: list[bytes] = []
    j: list[str] = []
    r: list[str] = []
    size = EMPTY_BYTES
    for is_r, e in chain(((False, e) for e in entries), ((True, e) for e in recheck)):
        item = json.dumps(list(e), separators=(",", ":"))
        if EMPTY_BYTES + _growth(item, is_r, 0, 0) > DATAGRAM_BYTES:
            continue
        if (j or r) and (len(j) + len(r) >= MAX_ENTRIES
                         or size + _growth(item, is_r, len(j), len(r)) > DATAGRAM_BYTES):
            out.append(_datagram(j, r))
            j, r, size = [], [], EMPTY_BYTES
        size += _growth(item, is_r, len(j), len(r))
        (r if is_r else j).append(item)
    if j or r:
        out.append(_datagram(j, r))
    return out


# ``{"v":1,"j":[]}``: a datagram's bytes before its entries (``json.dumps`` escapes
# anything beyond ASCII, so characters are bytes).
EMPTY_BYTES = 14


def _growth(item: str, is_r: bool, n_j: int, n_r: int) -> int:
    """Bytes ``item`` adds to a datagram holding ``n_j`` and ``n_r`` entries: itself, a
    comma after another entry of its list, and ``,"r":[]`` for the first retired one."""
    n = n_r if is_r else n_j
    return len(item) + (n > 0) + (7 if is_r and n_r == 0 else 0)


def _datagram(j: list[str], r: list[str]) -> bytes:
    # "j" always, even empty: a poller that predates "r" then reads an empty nudge
    # instead of rejecting the datagram as malformed.
    text = '{"v":1,"j":[' + ",".join(j) + "]"
    if r:
        text += ',"r":[' + ",".join(r) + "]"
    return (text + "}").encode()


def decode(data: bytes) -> list[Entry]:
    """The due-now entries (``"j"``) of a datagram; see ``decode_message``."""
    return decode_message(data)[0]


def decode_message(data: bytes) -> tuple[list[Entry], list[Entry]]:
    """The due-now (``"j"``) and retired (``"r"``) entries of a datagram, each valid by
    ``check_entry``; a missing list is empty. Raises ``ValueError`` (and nothing else) for
    anything that is not a whole, valid nudge: one bad entry in either list rejects the
    datagram, and so do more than ``MAX_ENTRIES`` entries over both lists."""
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
    if "j" not in msg and "r" not in msg:
        raise ValueError("not a nudge (no entry list)")
    lists = []
    for key in ("j", "r"):
        items = msg.get(key, [])
        if not isinstance(items, list):
            raise ValueError(f"not a nudge ({key!r} is not an entry list)")
        lists.append(items)
    if len(lists[0]) + len(lists[1]) > MAX_ENTRIES:
        raise ValueError(f"{len(lists[0]) + len(lists[1])} entries; a nudge has at most {MAX_ENTRIES}")
    return [check_entry(e) for e in lists[0]], [check_entry(e) for e in lists[1]]


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

