"""Fleet coordination on ZooKeeper (``coord.Coordinator``): members are ephemeral nodes
under ``/root/members``; shard n's lock is a kazoo ``Lock`` under ``/root/locks/n``; the
fencing token is the ``czxid`` of our own lock node (64-bit, later holders get larger
values; never the sequence suffix, which is a signed 32-bit counter that wraps); the
published plan is ``/root/assignment``, replaced by compare-and-set on its version.

Lease: a round trip to the server that started at monotonic time t proves the session
alive at t, so the server will not expire it before t + session timeout. We fire only
until t + session_timeout / 2 and renew every session_timeout / 6, and stop at once on
SUSPENDED. A process frozen (SIGSTOP, a long GC pause) past its session therefore finds
its lease expired when it wakes, before its first release.

Reads at rest: only the lease's round trip. The member list, the plan and our lock nodes
are read again when a watch says they changed (or after a reconnect): a one-shot watch
only marks what it watched as stale, and the next read arms a new one (polling them cost
about 14,000 reads/s at 1,000 members and 16,384 shards).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from ..domain.plan import Plan, decode, encode
from ..errors import ConfigError, InvalidInput, StoreUnavailable
from ..security import ZkSecurity
from . import dcs as dcrec
from .zkconn import RECONNECT, heal_acls, kazoo_client, zk_unreachable

log = logging.getLogger("scheduler.coord")

# The ZooKeeper session timeout, seconds, unless told otherwise (``--session-timeout``).
DEFAULT_SESSION_TIMEOUT_S = 10.0


class ZooKeeperCoordinator:
    def __init__(self, hosts: str, root: str, *, session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
                 credentials: str | None = None, security: ZkSecurity | None = None,
                 dc: str | None = None) -> None:
        self.hosts, self.root = hosts, root.rstrip("/") or "/scheduler"
        self.session_timeout_s = session_timeout_s
        # kazoo's default reconnection delay doubles up to an hour: after a 30 s outage of
        # every server it waited up to ~50 s more once they were back. Our servers are
        # few and a connection attempt is cheap: retry at least every second.
        self.security = security or ZkSecurity()
        self.zk = kazoo_client(hosts, session_timeout_s, credentials, self.security,
                               default_acl=self.security.acl(credentials),
                               connection_retry=RECONNECT)
        self.member_id = ""
        self.dc = dc  # advertised in our member node's data
        self._dcs: dict[str, str | None] = {}  # member -> DC, read once per member node
        self._home: dict[str, int] = {}
        self._home_stale = True
        self._plan: tuple[Plan | None, int] = (None, -1)
        self._plan_zxid = -1  # mzxid of the plan read: unlike the version, it survives a re-create
        self._plan_stale = True
        self._members: list[str] = []
        self._members_stale = True
        self._suspect: set[int] = set()  # held shards whose lock node's watch fired
        self._locks: dict[int, Any] = {}
        self._tokens: dict[int, int] = {}
        self._lock = threading.Lock()
        self._lease_until = 0.0
        self._suspended = False
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._heart: threading.Thread | None = None

    # --- lifecycle --------------------------------------------------------------------

    def start(self, member_id: str) -> None:
        from kazoo.exceptions import KazooException
        from kazoo.handlers.threading import KazooTimeoutError

        self.member_id = member_id
        self.zk.add_listener(self._on_state)
        try:
            self.zk.start(timeout=15)
        except (KazooTimeoutError, KazooException) as exc:
            with contextlib.suppress(Exception):
                self.zk.stop()
                self.zk.close()
            raise zk_unreachable(self.hosts, exc, self.security,
                                 "start it (ops/zookeeper start) or fix --coordinator") from None
        for path in (f"{self.root}/members", f"{self.root}/locks"):
            self.zk.ensure_path(path)
        heal_acls(self.zk, self.root, self.zk.default_acl)
        try:
            self._create_member(f"{self.root}/members/{member_id}")
        except ConfigError:
            self.zk.stop()
            self.zk.close()
            raise
        self._renew()
        self._heart = threading.Thread(target=self._heartbeat, name=f"{member_id}-zk", daemon=True)
        self._heart.start()

    def _create_member(self, path: str) -> None:
        """Create our member node. A node of that name left by an earlier session (the
        same poller restarted at once, e.g. by ``--processes``) goes when that session
        expires: wait for it, up to the session timeout and a margin. Raises
        ``ConfigError`` when it outlives that: another live poller has this name."""
        from kazoo.exceptions import NodeExistsError

        give_up = time.monotonic() + self.session_timeout_s * 1.5 + 2.0
        while True:
            try:
                self.zk.create(path, dcrec.encode_member(self.dc), ephemeral=True)
                return
            except NodeExistsError:
                stat = self.zk.exists(path)
                if stat is not None and stat.ephemeralOwner == self.zk.client_id[0]:
                    return  # ours: a create retried after a lost connection
            if time.monotonic() > give_up:
                raise ConfigError(
                    f"a poller named {self.member_id!r} is already in the fleet at {self.root}; "
                    "give each poller a unique --name (or none: a random one)")
            time.sleep(0.2)

    def stop(self) -> None:
        """Release the locks and close the session; never blocks on a lost connection
        (kazoo queues requests until it reconnects): the ephemeral nodes then go with
        the session."""
        self._stop.set()
        for shard in list(self._locks):
            self.release(shard)
        with contextlib.suppress(Exception):  # already closed or never connected
            self.zk.stop()
            self.zk.close()

    # --- events -----------------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        from kazoo.protocol.states import KazooState

        if state == KazooState.SUSPENDED:
            self._suspended = True
            log.warning("ZooKeeper connection suspended: not firing until it is back",
                        extra={"action": "zk_suspended"})
        elif state == KazooState.LOST:
            self._suspended = True
            self._lost.set()
            with self._lock:
                self._locks.clear()
                self._tokens.clear()
            if not self._stop.is_set():  # closing our own session at stop is no loss
                log.error("ZooKeeper session lost: every shard lock is gone",
                          extra={"action": "zk_session_lost"})
        else:
            # Watches fire for what changed while we were away (kazoo re-arms them), but a
            # read after a reconnect costs little and depends on nothing.
            self._members_stale = self._plan_stale = self._home_stale = True
            with self._lock:
                self._suspect |= set(self._locks)
            self._suspended = False
            log.info("ZooKeeper connected", extra={"action": "zk_connected"})

    def _renew(self) -> bool:
        t0 = time.monotonic()
        if not self.zk.connected:
            return False
        try:
            self.zk.exists(f"{self.root}/members/{self.member_id}")
        except Exception:
            return False
        self._lease_until = t0 + self.session_timeout_s / 2
        return True

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.session_timeout_s / 6):
            if self._renew():
                self._verify_locks()

    def _verify_locks(self) -> None:
        """Drop locks whose node is gone or not ours, reading only those whose watch
        fired (every held one after a reconnect). A failed read leaves them suspect."""
        if not self.zk.connected:
            return
        with self._lock:
            suspects, self._suspect = sorted(self._suspect), set()
        for i, shard in enumerate(suspects):
            lock = self._locks.get(shard)
            if lock is None:
                continue  # released: its node's deletion fired the watch
            try:
                stat = self.zk.exists(f"{lock.path}/{lock.node}", watch=self._on_lock) if lock.node else None
            except Exception:
                with self._lock:
                    self._suspect.update(suspects[i:])
                return
            if stat is None or stat.czxid != self._tokens.get(shard):
                with self._lock:
                    self._locks.pop(shard, None)
                    self._tokens.pop(shard, None)

    # Watch callbacks run on kazoo's event thread: they only mark, never call ZooKeeper.
    def _on_members(self, event: Any) -> None:
        self._members_stale = True

    def _on_plan(self, event: Any) -> None:
        self._plan_stale = True

    def _on_home(self, event: Any) -> None:
        self._home_stale = True

    def _on_lock(self, event: Any) -> None:
        """``event.path`` is ``<root>/locks/<shard>/<node>``."""
        with contextlib.suppress(ValueError, IndexError, AttributeError), self._lock:
            self._suspect.add(int(event.path.rsplit("/", 2)[-2]))

    # --- queries ----------------------------------------------------------------------

    def members(self) -> list[str]:
        if not self.zk.connected:  # kazoo would hold the call until it reconnects
            return []
        if self._members_stale:
            # Cleared before the read, which arms the next watch: no change is missed.
            self._members_stale = False
            try:
                self._members = sorted(self.zk.get_children(f"{self.root}/members", watch=self._on_members))
            except Exception:
                self._members_stale = True
                return []
        return list(self._members)

    def try_acquire(self, shard: int) -> int | None:
        if shard in self._locks:
            return self._tokens[shard]
        if not self.zk.connected:
            return None
        lock = self.zk.Lock(f"{self.root}/locks/{shard}", self.member_id)
        try:
            if not lock.acquire(blocking=False):
                return None
            stat = self.zk.exists(f"{lock.path}/{lock.node}", watch=self._on_lock)
        except Exception as exc:
            log.warning("acquiring shard %d failed: %s", shard, exc, extra={"action": "zk_lock_failed"})
            return None
        if stat is None:
            return None
        with self._lock:
            self._locks[shard] = lock
            self._tokens[shard] = int(stat.czxid)
        return int(stat.czxid)

    def release(self, shard: int) -> None:
        with self._lock:
            lock = self._locks.pop(shard, None)
            self._tokens.pop(shard, None)
        if lock is not None and self.zk.connected:
            with contextlib.suppress(Exception):  # session gone: its ephemeral node went with it
                lock.release()

    def token_ceiling(self) -> int | None:
        """A zxid above every token issued before the call (a write's, ordered by the leader)."""
        try:
            return int(self.zk.set(f"{self.root}/locks", b"").mzxid) if self.zk.connected else None
        except Exception as exc:
            log.warning("could not write %s/locks to bound the fencing tokens: %s", self.root, exc,
                        extra={"action": "zk_ceiling_failed"})
            return None

    def held(self) -> set[int]:
        with self._lock:
            return set(self._locks)

    def lease_valid(self) -> bool:
        return (not self._suspended and not self._lost.is_set() and self.zk.connected
                and time.monotonic() < self._lease_until)

    def session_lost(self) -> bool:
        return self._lost.is_set()

    def leave(self) -> None:
        """Delete our member node. Raises ``StoreUnavailable`` when ZooKeeper cannot be
        reached (the caller retries on its next tick)."""
        from kazoo.exceptions import NoNodeError

        if not self.zk.connected:
            raise StoreUnavailable("leaving the fleet failed: ZooKeeper is not connected")
        self._members_stale = True
        try:
            self.zk.delete(f"{self.root}/members/{self.member_id}")
        except NoNodeError:
            pass
        except Exception as exc:  # ConnectionLoss, a timeout of kazoo's handler
            raise StoreUnavailable(f"leaving the fleet failed: {exc!r}") from None

    def read_plan(self) -> tuple[Plan | None, int]:
        """Reads the node's stat only after its watch fired (or a reconnect, or a
        publish), and its data only when it changed."""
        if not self._plan_stale:
            return self._plan
        path = f"{self.root}/assignment"
        self._plan_stale = False  # before the read, which arms the next watch
        try:
            stat = self.zk.exists(path, watch=self._on_plan)
            if stat is None:
                self._plan, self._plan_zxid = (None, -1), -1
            elif stat.mzxid != self._plan_zxid:
                data, stat = self.zk.get(path)
                self._plan, self._plan_zxid = (decode(data), stat.version), stat.mzxid
        except Exception as exc:  # ConnectionLoss, NoNode (deleted meanwhile), a timeout
            self._plan_stale = True
            raise StoreUnavailable(f"reading the fleet's shard assignment failed: {exc!r}") from None
        return self._plan

    def publish_plan(self, plan: Plan, version: int) -> bool:
        from kazoo.exceptions import BadVersionError, NodeExistsError

        path, data = f"{self.root}/assignment", encode(plan)
        self._plan_stale = True  # whatever happens, read it again
        try:
            if version < 0:
                self.zk.create(path, data)
            else:
                self.zk.set(path, data, version=version)
        except (BadVersionError, NodeExistsError):
            return False
        except Exception as exc:
            raise StoreUnavailable(f"publishing the fleet's shard assignment failed: {exc!r}") from None
        return True

    def join(self) -> None:
        from kazoo.exceptions import NodeExistsError

        if not self.zk.connected:
            raise StoreUnavailable("joining the fleet failed: ZooKeeper is not connected")
        self._members_stale = True
        try:
            self.zk.create(f"{self.root}/members/{self.member_id}", dcrec.encode_member(self.dc),
                           ephemeral=True)
        except NodeExistsError:
            pass
        except Exception as exc:  # ConnectionLoss, a timeout of kazoo's handler
            raise StoreUnavailable(f"joining the fleet failed: {exc!r}") from None

    # --- data centres (dcs.py) --------------------------------------------------------

    def member_dcs(self) -> dict[str, str | None]:
        """Live members and the DC each advertises. A member node's data is read once
        (a member's DC is fixed for its node's life); one that cannot be read counts as
        no DC until the next membership change."""
        from kazoo.exceptions import NoNodeError

        names = self.members()
        if not names:
            return {}
        for name in [n for n in names if n not in self._dcs]:
            try:
                data, _ = self.zk.get(f"{self.root}/members/{name}")
                self._dcs[name] = dcrec.decode_member(data)
            except NoNodeError:
                continue  # gone meanwhile: the watch says so
            except Exception:
                self._members_stale = True
                return {n: self._dcs.get(n) for n in names}
        self._dcs = {n: self._dcs[n] for n in names if n in self._dcs}
        return {n: self._dcs.get(n) for n in names}

    def read_home(self) -> dict[str, int]:
        """The home-DC rule, read again only after its watch fired. Raises
        ``StoreUnavailable`` when it cannot be read; a node that does not parse keeps the
        last good rule (logged)."""
        if not self._home_stale:
            return self._home
        self._home_stale = False
        try:
            self._home = dcrec.read_home(self.zk, self.root, watch=self._on_home)
        except InvalidInput as exc:
            log.error("%s; keeping the rule read before", exc, extra={"action": "home_unreadable"})
        except Exception as exc:
            self._home_stale = True
            raise StoreUnavailable(f"reading the home-DC rule failed: {exc!r}") from None
        return self._home

    def record_outage(self, record: dict[str, Any]) -> None:
        try:
            dcrec.record_outage(self.zk, self.root, record, self.zk.default_acl)
        except Exception as exc:
            raise StoreUnavailable(f"recording the take-over of shard {record.get('shard')} failed: "
                                   f"{exc!r}") from None

    def close_outages(self, shard: int, ended_ms: int, to_bucket: int) -> list[dict[str, Any]]:
        try:
            return dcrec.close_outages(self.zk, self.root, shard, ended_ms, to_bucket)
        except Exception as exc:
            raise StoreUnavailable(f"closing the take-over records of shard {shard} failed: "
                                   f"{exc!r}") from None

    def mark_caught_up(self, record: dict[str, Any], at_ms: int, moved: int) -> None:
        try:
            dcrec.mark_caught_up(self.zk, self.root, str(record["node"]), at_ms, moved)
        except Exception as exc:
            raise StoreUnavailable(f"marking the take-over record {record.get('node')} caught up "
                                   f"failed: {exc!r}") from None
