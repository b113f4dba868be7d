"""The due-now fast path, producer side: after writing jobs that the late-write rule
placed at ``now + late_margin`` although they are due sooner, tell each one's shard owner
(one UDP datagram per owner and group; see ``scheduler/poller/nudge.py``), so it fires
them at their due time instead of at their placed time.

The same datagrams also name rows a producer just *retired* (a job moved by slow-write
repair or a reschedule, or cancelled): an owner that queued such a row before the change
drops it once the store confirms it (see ``retire``), so it does not fire as well.

Best effort by design: nothing here can fail a ``schedule`` call. A stale owner map, a
poller without a listener, a lost datagram: the job fires at its placed time, as without
this path. The owner map (shard -> owner from the checkpoints, owner -> address from
``notify_endpoints``) is read only when due-now jobs are written, at most every
``OWNERS_TTL_S``.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections import defaultdict
from collections.abc import Sequence

from ..domain.clock import Clock
from ..domain.effects import Steps, call
from ..domain.model import Job, Status
from ..errors import SchedulerError
from .wire import Entry, encode, parse_address

log = logging.getLogger("scheduler.client")

OWNERS_TTL_S = 2.0
# Rows nudged: those placed up to this far beyond ``now + late margin`` (the late-write
# rule's position, plus the room slow-write repair gives a moved job; the poller's
# ``AHEAD_SLACK_MS`` takes them, with time for transit).
NUDGE_AHEAD_MS = 11_000
# Retired rows worth telling an owner about: those it may hold already (read ahead by
# its cursor, or taken on a nudge).
RETIRE_AHEAD_MS = NUDGE_AHEAD_MS + 2_000


class Nudger:
    def __init__(self, clock: Clock, late_margin_ms: int) -> None:
        self.clock = clock
        self.late_margin_ms = late_margin_ms
        self._owners: dict[int, str] = {}  # shard -> address
        self._owners_at = -1e9
        self._socks: dict[int, socket.socket] = {}
        self._lock = threading.Lock()
        self.sent = 0  # datagrams, for tests and benchmarks
        self._failed = False

    def nudge(self, jobs: Sequence[Job]) -> Steps[None]:
        """Nudge the owners of the due-now jobs among ``jobs`` (just written)."""
        now = self.clock.now_ms()
        near = [j for j in jobs if j.status is Status.PENDING and j.due_ms < j.fire_ms
                and j.fire_ms <= now + self.late_margin_ms + NUDGE_AHEAD_MS]
        if near:
            yield from self._refresh(now)
            self._send_all(near, retired=False)

    def prepare(self, jobs: Sequence[Job]) -> Steps[None]:
        """Before writing ``jobs``: read the owner map now if any may need a nudge or a
        retire after the write, so that neither waits for it then (a retire must reach
        the owner before the old row's time)."""
        now = self.clock.now_ms()
        if any(j.due_ms <= now + self.late_margin_ms + NUDGE_AHEAD_MS for j in jobs):
            yield from self._refresh(now)

    def retire(self, old: Sequence[Job]) -> Steps[None]:
        """Tell the owners of ``old``'s near-term rows that they were just retired (moved
        or cancelled; the store already shows them done): an owner that queued one before
        drops it instead of firing it. Call only after the store acknowledged the change."""
        now = self.clock.now_ms()
        near = [j for j in old if j.fire_ms <= now + self.late_margin_ms + RETIRE_AHEAD_MS]
        if near:
            if not self._owners:  # else the map in hand, however old: a retire is urgent
                yield from self._refresh(now)
            self._send_all(near, retired=True)

    def _refresh(self, now: int) -> Steps[None]:
        """Read the owner map again when it is older than ``OWNERS_TTL_S``; on a store
        error keep the old one (and say so once)."""
        if self.clock.monotonic() - self._owners_at < OWNERS_TTL_S:
            return
        try:
            checkpoints = yield from call("checkpoints")
            endpoints = yield from call("notify_endpoints", now)
        except SchedulerError as exc:
            if not self._failed:
                log.warning("cannot read the shard owners for nudges (%s): due-now jobs fire "
                            "at now + late margin until they can be read", exc,
                            extra={"action": "nudge_owners_failed"})
            self._failed = True
            self._owners_at = self.clock.monotonic()  # not again before the TTL
            return
        self._failed = False
        self._owners = {c.shard: endpoints[c.owner] for c in checkpoints
                        if c.owner is not None and c.owner in endpoints}
        self._owners_at = self.clock.monotonic()

    def _send_all(self, jobs: Sequence[Job], retired: bool) -> None:
        by_address: dict[str, list[Entry]] = defaultdict(list)
        for j in jobs:
            address = self._owners.get(j.shard)
            if address is not None:
                by_address[address].append((j.shard, j.bucket, j.fire_ms, j.job_id))
        for address, entries in by_address.items():
            self._send(address, [] if retired else entries, entries if retired else [])

    def _send(self, address: str, entries: list[Entry], retired: list[Entry]) -> None:
        try:
            host, port = parse_address(address)
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with self._lock:  # one socket per family, whichever thread comes first
                sock = self._socks.get(family)
                if sock is None:
                    sock = self._socks[family] = socket.socket(family, socket.SOCK_DGRAM)
                    sock.setblocking(False)
            for datagram in encode(entries, recheck=retired):
                sock.sendto(datagram, (host, port))
                self.sent += 1
        except (OSError, ValueError):
            pass  # unreachable or full: these jobs take the usual path

    def close(self) -> None:
        with self._lock:
            for sock in self._socks.values():
                sock.close()
            self._socks.clear()
