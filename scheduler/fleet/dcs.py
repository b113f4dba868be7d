"""The fleet's data-centre records in ZooKeeper, beside the plan:

- a member node's data: ``{"dc": "dc1"}`` (empty for a member without a DC, as before);
- ``/root/home``: the home-DC rule, ``{"v": 1, "weights": {"dc1": 1, "dc2": 1}}``
  (absent: no rule, every member may own every shard);
- ``/root/outages/s<shard>-<seq>``: one node per take-over of a shard by a DC other
  than its home, ``{"shard", "home_dc", "dc", "member", "at_ms", "from_bucket"}``, with
  ``"ended_ms"`` and ``"to_bucket"`` added when a member of the home DC claims it back,
  and ``"caught_up_ms"`` and ``"moved"`` once that member has read the window's buckets
  again and moved what was left unfired (the catch-up). They are kept, as the fleet's
  history of take-overs, for ``KEEP_MS`` (30 days) after their catch-up.

Everything read here came from outside the process: a node that does not parse is
reported as such (``None`` or skipped), never raised as a crash.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from ..domain.home import format_weights, parse_weights
from ..errors import InvalidInput

# Caught-up take-over records are kept this long, then deleted by the next home claim
# of their shard.
KEEP_MS = 30 * 86_400_000


def encode_member(dc: str | None) -> bytes:
    return b"" if dc is None else json.dumps({"dc": dc}, separators=(",", ":")).encode()


def decode_member(data: bytes) -> str | None:
    """The DC a member advertises; None for none, or for data this version cannot read."""
    try:
        doc = json.loads(data) if data else {}
        dc = doc.get("dc") if isinstance(doc, dict) else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return dc if isinstance(dc, str) and dc else None


def encode_home(weights: dict[str, int]) -> bytes:
    return json.dumps({"v": 1, "weights": dict(sorted(weights.items()))}, separators=(",", ":")).encode()


def decode_home(data: bytes) -> dict[str, int]:
    """The rule in ``data`` ({} for an empty node). Raises ``InvalidInput`` (one line)
    for a node that does not hold a valid rule."""
    if not data:
        return {}
    try:
        doc = json.loads(data)
        weights = doc["weights"] if isinstance(doc, dict) and doc.get("v") == 1 else None
        if not isinstance(weights, dict) or not all(isinstance(w, int) for w in weights.values()):
            raise InvalidInput("the home-DC rule in ZooKeeper is not one this version reads")
        return parse_weights(format_weights({str(k): int(v) for k, v in weights.items()}))
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, RecursionError) as exc:
        if isinstance(exc, InvalidInput):
            raise
        raise InvalidInput("the home-DC rule in ZooKeeper is not JSON this version reads; "
                           "set it again with `scheduler shards home --dc ...`") from None


def write_home(zk: Any, root: str, weights: dict[str, int] | None, acl: list[Any] | None) -> None:
    """Set the rule (None: remove it). kazoo errors propagate to the caller."""
    from kazoo.exceptions import NoNodeError
    from kazoo.security import Permissions

    path = f"{root}/home"
    if weights is None:
        with contextlib.suppress(NoNodeError):
            zk.delete(path)
        return
    if zk.exists(path):
        zk.set(path, encode_home(weights))
        return
    if acl is not None and zk.exists(root):
        # Plus the read-only entries the pollers put on the root (the readers they name):
        # run without SCHEDULER_ZK_READERS, this command would leave the rule closed to
        # them until a poller starts. Only read is copied: nothing else the root grants.
        readers = [a for a in zk.get_acls(root)[0] if a.perms == Permissions.READ and a not in acl]
        acl = [*acl, *readers]
    zk.create(path, encode_home(weights), acl=acl, makepath=True)


def read_home(zk: Any, root: str, watch: Any = None) -> dict[str, int]:
    """The rule ({} when none); ``InvalidInput`` for a node that does not parse."""
    stat = zk.exists(f"{root}/home", watch=watch)
    if stat is None:
        return {}
    data, _ = zk.get(f"{root}/home")
    return decode_home(data)


def record_outage(zk: Any, root: str, record: dict[str, Any], acl: list[Any] | None) -> str:
    """Create the record of a take-over; the path created. kazoo errors propagate."""
    path: str = zk.create(f"{root}/outages/s{int(record['shard'])}-",
                          json.dumps(record, separators=(",", ":")).encode(),
                          acl=acl, sequence=True, makepath=True)
    return path


def read_outages(zk: Any, root: str) -> list[dict[str, Any]]:
    """Every take-over record, oldest first by creation; unreadable ones skipped."""
    from kazoo.exceptions import NoNodeError

    if not zk.exists(f"{root}/outages"):
        return []
    out: list[dict[str, Any]] = []
    for name in sorted(zk.get_children(f"{root}/outages"), key=lambda n: n.rpartition("-")[2]):
        try:
            data, _ = zk.get(f"{root}/outages/{name}")
            doc = json.loads(data)
        except (NoNodeError, ValueError, UnicodeDecodeError, RecursionError):
            continue
        if isinstance(doc, dict):
            out.append({**doc, "node": name})
    return out


def _record(zk: Any, path: str) -> tuple[dict[str, Any], Any] | None:
    """The record at ``path`` and its stat; None when gone or not a JSON object."""
    from kazoo.exceptions import NoNodeError

    try:
        data, stat = zk.get(path)
        doc = json.loads(data)
    except (NoNodeError, ValueError, UnicodeDecodeError, RecursionError):
        return None
    return (doc, stat) if isinstance(doc, dict) else None


def _update(zk: Any, path: str, doc: dict[str, Any], stat: Any) -> None:
    # Compare and set: a record changed meanwhile raises (BadVersionError), and the
    # caller's claim or catch-up is tried again.
    zk.set(path, json.dumps(doc, separators=(",", ":")).encode(), version=stat.version)


def _prune(zk: Any, path: str, doc: dict[str, Any], now_ms: int) -> None:
    """Delete a caught-up record older than ``KEEP_MS``: the history is kept that long,
    and the listing every home claim reads stays short."""
    from kazoo.exceptions import NoNodeError

    caught_up = doc.get("caught_up_ms")
    if isinstance(caught_up, int) and caught_up < now_ms - KEEP_MS:
        with contextlib.suppress(NoNodeError):
            zk.delete(path)


def close_outages(zk: Any, root: str, shard: int, ended_ms: int, to_bucket: int) -> list[dict[str, Any]]:
    """Mark the open records of ``shard`` ended (the home DC claimed it back); the
    shard's ended records not caught up yet (these and any left by an earlier claim),
    each with its ``"node"``."""
    if not zk.exists(f"{root}/outages"):
        return []
    out = []
    for name in sorted(zk.get_children(f"{root}/outages"), key=lambda n: n.rpartition("-")[2]):
        found = _record(zk, f"{root}/outages/{name}") if name.startswith(f"s{shard}-") else None
        if found is None:
            continue
        if "caught_up_ms" in found[0]:
            _prune(zk, f"{root}/outages/{name}", found[0], ended_ms)
            continue
        doc, stat = found
        if "ended_ms" not in doc:
            doc.update(ended_ms=ended_ms, to_bucket=to_bucket)
            _update(zk, f"{root}/outages/{name}", doc, stat)
        out.append({**doc, "node": name})
    return out


def mark_caught_up(zk: Any, root: str, node: str, at_ms: int, moved: int) -> None:
    """Record that the window of ``node`` was caught up (``moved`` rows moved ahead);
    kept, as the fleet's history of take-overs. A record gone meanwhile is ignored."""
    found = _record(zk, f"{root}/outages/{node}")
    if found is not None:
        doc, stat = found
        doc.update(caught_up_ms=at_ms, moved=moved)
        _update(zk, f"{root}/outages/{node}", doc, stat)
