"""The wire format of nudges (the due-now fast path: ``scheduler/nudger.py`` sends them,
``scheduler/poller/nudge.py`` receives them). Pure.

A datagram is JSON: ``{"v": 1, "j": [[shard, bucket, fire_ms, job_id], ...]}``, each entry
the key of a bucket row a producer just wrote.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

# Datagrams stay under a typical path MTU: no fragmentation across a network.
DATAGRAM_BYTES = 1200
# (shard, bucket, fire_ms, job_id): the bucket row a producer wrote.
Entry = tuple[int, int, int, str]


def encode(entries: Iterable[Entry]) -> list[bytes]:
    """Datagrams carrying ``entries``, each at most ``DATAGRAM_BYTES`` (an entry alone
    over it is dropped: its job takes the usual path)."""
    out: list[bytes] = []
    batch: list[str] = []
    size = 0
    for e in entries:
        item = json.dumps(list(e), separators=(",", ":"))
        if size + len(item) + 1 > DATAGRAM_BYTES - 16 and batch:
            out.append(('{"v":1,"j":[' + ",".join(batch) + "]}").encode())
            batch, size = [], 0
        if len(item) + 16 <= DATAGRAM_BYTES:
            batch.append(item)
            size += len(item) + 1
    if batch:
        out.append(('{"v":1,"j":[' + ",".join(batch) + "]}").encode())
    return out


def decode(data: bytes) -> list[Entry]:
    """The entries of a datagram; raises ``ValueError`` for anything else."""
    msg = json.loads(data)
    if not isinstance(msg, dict) or msg.get("v") != 1 or not isinstance(msg.get("j"), list):
        raise ValueError("not a nudge")
    out = []
    for e in msg["j"]:
        if (not isinstance(e, list) or len(e) != 4 or not all(isinstance(x, int) for x in e[:3])
                or not isinstance(e[3], str)):
            raise ValueError("bad entry")
        out.append((e[0], e[1], e[2], e[3]))
    return out


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)
