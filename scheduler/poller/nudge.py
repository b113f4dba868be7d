"""The due-now fast path, poller side: producers *nudge* a shard's owner about jobs they
just placed at ``now + late_margin`` (the late-write rule) although they are due now,
and the owner fires them at their due time instead of 3 s later.

Transport: one UDP datagram per group of jobs (``encode``), best effort. Each poller
binds ``PollerConfig.notify_address`` and records the bound address in the store
(``notify_endpoints``, refreshed every 30 s, kept 120 s), so a producer finds a shard's
owner from the checkpoints (shard -> owner) and that table (owner -> address).

What a nudge can and cannot do. The owner reads the nudged positions from the store
(one range read per shard and bucket, all at once), ahead of its read cursor but without moving it,
and takes only rows that exist there, are pending, are not recurring occurrences, and
are due. Each leaves the due queue at its due time, so nothing fires before it is due,
whoever sent the datagram. The row is handed out *early* (``ShardProgress.take_early``):
the cursor still reads it later, so the checkpoint cannot pass it until its outcome is
recorded, and it is not queued a second time. A crash before the outcome is recorded
re-fires it, like any row in flight. A lost, late or misdirected datagram (the owner
changed) costs nothing but the old path: the row fires at its placed time.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections import defaultdict
from collections.abc import Iterable

from ..errors import SchedulerError, SchemaError
from ..model import OCCURRENCE_PREFIX, Job
from ..nudgewire import Entry, decode, parse_address
from ..progress import Key
from .shared import Core

log = logging.getLogger("scheduler.poller")

# A nudged range is read with this many rows to spare (other jobs placed in between).
READ_SLACK = 100
REGISTER_EVERY_S = 30.0


class Nudges:
    """Applies nudges to a poller's shards, and listens for them on a UDP socket."""

    def __init__(self, core: Core, prefetch_ms: int) -> None:
        self.core = core
        self.prefetch_ms = prefetch_ms
        self.sock: socket.socket | None = None
        self.address: str | None = None
        self._registered_at = -1e9
        self.bad = 0  # datagrams that were not nudges (the first is logged)

    def apply(self, entries: Iterable[Entry]) -> int:
        """Queue the nudged rows that qualify (see the module docstring); returns how
        many. A store error is reported to ``store_fault`` and the whole group is
        skipped: its rows take the usual path."""
        core = self.core
        wanted: dict[tuple[int, int], set[Key]] = defaultdict(set)
        with core.cond:
            for shard, bucket, fire_ms, job_id in entries:
                st = core.shards.get(shard)
                if st is not None and st.reading and not job_id.startswith(OCCURRENCE_PREFIX):
                    wanted[(shard, bucket)].add((fire_ms, job_id))
        parts = [(bucket, shard, (min(k[0] for k in keys) - 1, ""), max(k[0] for k in keys))
                 for (shard, bucket), keys in wanted.items()]
        limit = min(core.config.read_limit, max(map(len, wanted.values()), default=0) + READ_SLACK)
        try:
            # One concurrent read of every nudged range: sequential reads made the
            # listener fall behind a steady stream of nudges.
            found = core.store.read_buckets(parts, limit) if parts else []
        except SchedulerError as exc:
            core.store_fault.failed(exc)
            return 0
        taken = 0
        for (bucket, shard, _after, _until), rows in zip(parts, found, strict=True):
            taken += self._take(shard, bucket, wanted[(shard, bucket)], rows)
        if taken:
            core.metrics.nudged.inc(taken)
            core.stats.nudged += taken
        return taken

    def _take(self, shard: int, bucket: int, keys: set[Key], rows: list[Job]) -> int:
        core = self.core
        horizon = core.clock.now_ms() + self.prefetch_ms
        n = 0
        with core.cond:
            st = core.shards.get(shard)
            if st is None or not st.reading:
                return 0
            for row in rows:
                key = (row.fire_ms, row.job_id)
                if (key in keys and row.fired_ms is None and row.kind and row.due_ms <= horizon
                        and st.progress.take_early(bucket, key)):
                    core.due.push(row, at_ms=row.due_ms)
                    n += 1
            if n:
                core.cond.notify_all()
        return n

    # --- the listener -----------------------------------------------------------------

    def bind(self, address: str) -> str:
        """Bind the UDP socket; returns the address to advertise (a wildcard host is
        replaced by this host's name). Raises ``OSError`` when the address is taken."""
        host, port = parse_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        sock.bind((host, port))
        sock.settimeout(0.2)
        self.sock = sock
        bound_host, bound_port = sock.getsockname()[:2]
        if bound_host in ("0.0.0.0", "::"):
            bound_host = socket.getfqdn()
        self.address = f"[{bound_host}]:{bound_port}" if ":" in bound_host else f"{bound_host}:{bound_port}"
        return self.address

    def register(self, force: bool = False) -> None:
        """Record our address in the store, at most every ``REGISTER_EVERY_S`` (best
        effort: without it, producers only lose the fast path)."""
        core = self.core
        mono = core.clock.monotonic()
        if self.address is None or (not force and mono - self._registered_at < REGISTER_EVERY_S):
            return
        try:
            core.store.set_notify_endpoint(core.name, self.address, core.clock.now_ms())
            self._registered_at = mono
        except SchemaError as exc:
            # A keyspace older than v004 (pollers upgraded before `schema apply`): no fast
            # path until it is applied and the poller restarted; firing is unaffected.
            log.warning("cannot record this poller's nudge address (%s); due-now jobs fire at "
                        "now + late margin", exc, extra={"action": "nudge_unavailable", "poller": core.name})
            self.address = None
        except SchedulerError as exc:
            core.store_fault.failed(exc)

    def run(self) -> None:
        """The listener thread: receive, apply, re-register, until the poller stops."""
        core, sock = self.core, self.sock
        assert sock is not None
        self.register(force=True)
        while not core.stopping.is_set():
            self.register()
            try:
                data = sock.recv(65535)
            except TimeoutError:
                continue
            entries = self._drain(data)
            if entries:
                self.apply(entries)

    def _drain(self, data: bytes | None) -> list[Entry]:
        """The entries of ``data`` and of every datagram already waiting."""
        sock = self.sock
        assert sock is not None
        entries: list[Entry] = []
        sock.setblocking(False)
        while data is not None:
            try:
                entries.extend(decode(data))
            except ValueError:
                self.bad += 1
                if self.bad == 1:
                    log.warning("ignored a datagram that is not a nudge on %s", self.address,
                                extra={"action": "nudge_ignored", "poller": self.core.name})
            try:
                data = sock.recv(65535)
            except OSError:  # BlockingIOError: nothing more waiting
                data = None
        sock.settimeout(0.2)
        return entries

    def close(self) -> None:
        """Stop listening and remove our address (best effort)."""
        if self.sock is not None:
            self.sock.close()
        # Not while the store fails (a stop must not wait for its timeouts): the row's
        # TTL removes it, and producers meanwhile only lose the fast path.
        if self.address is not None and not self.core.store_fault.failing:
            with contextlib.suppress(SchedulerError):
                self.core.store.set_notify_endpoint(self.core.name, None, self.core.clock.now_ms())
