"""Coordination of a poller fleet: membership, one lock per shard, fencing tokens, and
a lease that says whether it is safe to fire right now.

``--coordinator`` (or ``SCHEDULER_COORDINATOR``) picks the implementation:

- ``zookeeper://h1:2181,h2:2181/root``: ``zkcoord.ZooKeeperCoordinator`` (members,
  locks, fencing tokens, the lease);
- ``local``: in-process, for the embedded mode and the demo.

Both also hold the fleet's published shard assignment (``plan.py``), replaced by
compare-and-set on its version.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from ..domain.plan import Plan
from ..security import ZkSecurity
from ..settings import zookeeper_credentials as read_credentials
from ..settings import zookeeper_security
from .url import check_coordinator_url
from .zkcoord import DEFAULT_SESSION_TIMEOUT_S, ZooKeeperCoordinator

__all__ = ["DEFAULT_SESSION_TIMEOUT_S", "Coordinator", "LocalCoordinator", "ZooKeeperCoordinator",
           "open_coordinator"]


class Coordinator(Protocol):
    member_id: str
    dc: str | None  # the DC this member advertises (None: none)

    def start(self, member_id: str) -> None: ...
    def stop(self) -> None: ...
    def members(self) -> list[str]:
        """Live members, sorted."""

    def try_acquire(self, shard: int) -> int | None:
        """Take the shard's lock without waiting; its fencing token, or None."""

    def release(self, shard: int) -> None: ...
    def token_ceiling(self) -> int | None:
        """A number at or above every token any member of this coordinator was issued
        before the call (None: no such bound): a stored epoch above it was set under
        another coordinator. Not a bound on this member's own tokens only: a stale
        claimer's shard would then be lowered too."""

    def held(self) -> set[int]:
        """Shards whose lock we still hold (a lost session empties it)."""

    def lease_valid(self) -> bool:
        """True while it is safe to fire for the shards held."""

    def session_lost(self) -> bool:
        """True once the session expired: every lock is gone, and this member with it."""

    def leave(self) -> None:
        """Stop being a member (others take our shards) while keeping the session."""

    def join(self) -> None:
        """Be a member again after ``leave``."""

    def read_plan(self) -> tuple[Plan | None, int]:
        """The published assignment and its version (-1: none was ever published)."""

    def publish_plan(self, plan: Plan, version: int) -> bool:
        """Publish ``plan`` if the published one is still at ``version`` (compare and
        set); False when another member published first."""

    def member_dcs(self) -> dict[str, str | None]:
        """Live members and the DC each advertises (None: none)."""

    def read_home(self) -> dict[str, int]:
        """The home-DC rule (``home.py``): a weight per DC; {} for none."""

    def record_outage(self, record: dict[str, Any]) -> None:
        """Keep the record of a take-over by a foreign DC (``dcs.py``); ``StoreUnavailable``
        when it cannot be written."""

    def close_outages(self, shard: int, ended_ms: int, to_bucket: int) -> list[dict[str, Any]]:
        """Mark ``shard``'s open take-over records ended; the shard's ended records whose
        window was not caught up yet (each with ``"node"``, its name). ``StoreUnavailable``
        when they cannot be read or written."""

    def mark_caught_up(self, record: dict[str, Any], at_ms: int, moved: int) -> None:
        """Record that ``record``'s window was caught up; ``StoreUnavailable`` on failure."""


class LocalCoordinator:
    """In-process coordination: members and locks in a registry shared by root name."""

    _registries: ClassVar[dict[str, dict[str, Any]]] = {}
    _guard: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, root: str = "default", dc: str | None = None) -> None:
        with self._guard:
            self._reg = self._registries.setdefault(
                root, {"members": set(), "locks": {}, "counter": 0, "plan": (None, -1), "dcs": {},
                       "home": {}, "outages": []})
        self.member_id = ""
        self.dc = dc

    def start(self, member_id: str) -> None:
        self.member_id = member_id
        with self._guard:
            self._reg["members"].add(member_id)
            self._reg["dcs"][member_id] = self.dc

    def stop(self) -> None:
        with self._guard:
            self._reg["members"].discard(self.member_id)
            for shard, (holder, _) in list(self._reg["locks"].items()):
                if holder == self.member_id:
                    del self._reg["locks"][shard]

    def members(self) -> list[str]:
        with self._guard:
            return sorted(self._reg["members"])

    def try_acquire(self, shard: int) -> int | None:
        with self._guard:
            holder = self._reg["locks"].get(shard)
            if holder is not None:
                return int(holder[1]) if holder[0] == self.member_id else None
            self._reg["counter"] += 1
            # Above any epoch a stored checkpoint may hold from an earlier run.
            token = time.time_ns() + self._reg["counter"]
            self._reg["locks"][shard] = (self.member_id, token)
            return int(token)

    def release(self, shard: int) -> None:
        with self._guard:
            if self._reg["locks"].get(shard, ("",))[0] == self.member_id:
                del self._reg["locks"][shard]

    def token_ceiling(self) -> int | None:
        return None  # tokens from the clock: never lowers a stored epoch

    def held(self) -> set[int]:
        with self._guard:
            return {s for s, (h, _) in self._reg["locks"].items() if h == self.member_id}

    def lease_valid(self) -> bool:
        return True

    def session_lost(self) -> bool:
        return False

    def leave(self) -> None:
        with self._guard:
            self._reg["members"].discard(self.member_id)

    def join(self) -> None:
        with self._guard:
            self._reg["members"].add(self.member_id)

    def read_plan(self) -> tuple[Plan | None, int]:
        with self._guard:
            return self._reg["plan"]  # type: ignore[no-any-return]

    def publish_plan(self, plan: Plan, version: int) -> bool:
        with self._guard:
            if self._reg["plan"][1] != version:
                return False
            self._reg["plan"] = (plan, version + 1)
            return True

    def member_dcs(self) -> dict[str, str | None]:
        with self._guard:
            return {m: self._reg["dcs"].get(m) for m in sorted(self._reg["members"])}

    def read_home(self) -> dict[str, int]:
        with self._guard:
            return dict(self._reg["home"])

    def set_home(self, weights: dict[str, int] | None) -> None:
        """Set the rule of this registry (in-process fleets and tests)."""
        with self._guard:
            self._reg["home"] = dict(weights or {})

    def record_outage(self, record: dict[str, Any]) -> None:
        with self._guard:
            self._reg["outages"].append(dict(record))

    def close_outages(self, shard: int, ended_ms: int, to_bucket: int) -> list[dict[str, Any]]:
        out = []
        with self._guard:
            for i, rec in enumerate(self._reg["outages"]):
                if rec["shard"] != shard or "caught_up_ms" in rec:
                    continue
                if "ended_ms" not in rec:
                    rec.update(ended_ms=ended_ms, to_bucket=to_bucket)
                out.append({**rec, "node": f"s{shard}-{i}"})
        return out

    def mark_caught_up(self, record: dict[str, Any], at_ms: int, moved: int) -> None:
        with self._guard:
            i = int(str(record["node"]).rpartition("-")[2])
            self._reg["outages"][i].update(caught_up_ms=at_ms, moved=moved)


def open_coordinator(url: str | None, *, session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
                     credentials: Callable[[], str | None] = read_credentials,
                     security: Callable[[], ZkSecurity] = zookeeper_security,
                     dc: str | None = None) -> Coordinator:
    """``local`` or ``zookeeper://h1:2181,h2:2181/root``; ``ConfigError`` (one line) for a
    malformed URL, checked before anything connects. ``dc``: the DC the member
    advertises in its membership data."""
    if not url or url == "local":
        return LocalCoordinator(dc=dc)
    zk_url = check_coordinator_url(url)  # ConfigError, one line, before anything connects
    if zk_url is None:
        return LocalCoordinator(url.split(":", 1)[1] or "default", dc=dc)
    return ZooKeeperCoordinator(zk_url.hosts, zk_url.root,
                                session_timeout_s=session_timeout_s, credentials=credentials(),
                                security=security(), dc=dc)
