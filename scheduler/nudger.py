"""The due-now fast path, producer side: after writing jobs that the late-write rule
placed at ``now + late_margin`` although they are due sooner, tell each one's shard owner
(one UDP datagram per owner and group; see ``scheduler/poller/nudge.py``), so it fires
them at their due time instead of at their placed time.

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

from .clock import Clock
from .effects import Steps, call
from .errors import SchedulerError
from .model import Job, Status
from .nudgewire import Entry, encode, parse_address

log = logging.getLogger("scheduler.client")

OWNERS_TTL_S = 2.0


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
                and j.fire_ms <= now + self.late_margin_ms + 1000]
        if not near:
            return
        if self.clock.monotonic() - self._owners_at >= OWNERS_TTL_S:
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
        by_address: dict[str, list[Entry]] = defaultdict(list)
        for j in near:
            address = self._owners.get(j.shard)
            if address is not None:
                by_address[address].append((j.shard, j.bucket, j.fire_ms, j.job_id))
        for address, entries in by_address.items():
            self._send(address, entries)

    def _send(self, address: str, entries: list[Entry]) -> None:
        try:
            host, port = parse_address(address)
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with self._lock:  # one socket per family, whichever thread comes first
                sock = self._socks.get(family)
                if sock is None:
                    sock = self._socks[family] = socket.socket(family, socket.SOCK_DGRAM)
                    sock.setblocking(False)
            for datagram in encode(entries):
                sock.sendto(datagram, (host, port))
                self.sent += 1
        except (OSError, ValueError):
            pass  # unreachable or full: these jobs take the usual path

    def close(self) -> None:
        with self._lock:
            for sock in self._socks.values():
                sock.close()
            self._socks.clear()
