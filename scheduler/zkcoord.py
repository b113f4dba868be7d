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
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from .errors import ConfigError, StoreUnavailable
from .plan import Plan, decode, encode
from .security import ZkSecurity
from .zkconn import RECONNECT, heal_acls, kazoo_client, zk_unreachable

log = logging.getLogger("scheduler.coord")


# The ZooKeeper session timeout, seconds, unless told otherwise (``--session-timeout``).
DEFAULT_SESSION_TIMEOUT_S = 10.0


class ZooKeeperCoordinator:
    def __init__(self, hosts: str, root: str, *, session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
                 credentials: str | None = None, security: ZkSecurity | None = None) -> None:
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
        self._plan: tuple[Plan | None, int] = (None, -1)
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
        # The fleet reads the member list every tick (0.5 s), so no watch is needed.
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
                self.zk.create(path, b"", ephemeral=True)
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
        """After a reconnect (or any time): drop locks whose node is gone or not ours."""
        if not self.zk.connected:
            return
        for shard, lock in list(self._locks.items()):
            try:
                stat = self.zk.exists(f"{lock.path}/{lock.node}") if lock.node else None
            except Exception:
                return
            if stat is None or stat.czxid != self._tokens.get(shard):
                with self._lock:
                    self._locks.pop(shard, None)
                    self._tokens.pop(shard, None)

    # --- queries ----------------------------------------------------------------------

    def members(self) -> list[str]:
        if not self.zk.connected:  # kazoo would hold the call until it reconnects
            return []
        try:
            return sorted(self.zk.get_children(f"{self.root}/members"))
        except Exception:
            return []

    def try_acquire(self, shard: int) -> int | None:
        if shard in self._locks:
            return self._tokens[shard]
        if not self.zk.connected:
            return None
        lock = self.zk.Lock(f"{self.root}/locks/{shard}", self.member_id)
        try:
            if not lock.acquire(blocking=False):
                return None
            stat = self.zk.exists(f"{lock.path}/{lock.node}")
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
        try:
            self.zk.delete(f"{self.root}/members/{self.member_id}")
        except NoNodeError:
            pass
        except Exception as exc:  # ConnectionLoss, a timeout of kazoo's handler
            raise StoreUnavailable(f"leaving the fleet failed: {exc!r}") from None

    def read_plan(self) -> tuple[Plan | None, int]:
        """Reads the node's version every call and its data only when that changed."""
        path = f"{self.root}/assignment"
        try:
            stat = self.zk.exists(path)
            if stat is None:
                return None, -1
            if stat.version != self._plan[1]:
                data, stat = self.zk.get(path)
                self._plan = (decode(data), stat.version)
        except Exception as exc:  # ConnectionLoss, NoNode (deleted meanwhile), a timeout
            raise StoreUnavailable(f"reading the fleet's shard assignment failed: {exc!r}") from None
        return self._plan

    def publish_plan(self, plan: Plan, version: int) -> bool:
        from kazoo.exceptions import BadVersionError, NodeExistsError

        path, data = f"{self.root}/assignment", encode(plan)
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
        try:
            self.zk.create(f"{self.root}/members/{self.member_id}", b"", ephemeral=True)
        except NodeExistsError:
            pass
        except Exception as exc:  # ConnectionLoss, a timeout of kazoo's handler
            raise StoreUnavailable(f"joining the fleet failed: {exc!r}") from None
