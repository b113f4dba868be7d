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

Hostile datagrams. Anyone who reaches the socket can send anything, so nothing a
datagram holds may end or stall the listener: ``decode`` raises only ``ValueError``;
any exception while decoding or applying is caught per datagram, counted
(``scheduler_nudges_rejected_total``) and logged once, then summarised; entries that
cannot name a row this poller could take are skipped without a read; and the listener
applies at most ``MAX_BATCH`` datagrams at a time, so a flood cannot keep it from
re-registering or from seeing the poller stop.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from ..errors import SchedulerError, SchemaError
from ..faults import Summarised
from ..keys import bucket_of_ms
from ..model import OCCURRENCE_PREFIX, Job
from ..nudgewire import Entry, check_entry, decode, parse_address
from ..progress import Key
from .shared import Core

log = logging.getLogger("scheduler.poller")

# A nudged range is read with this many rows to spare (other jobs placed in between).
READ_SLACK = 100
REGISTER_EVERY_S = 30.0
# Datagrams applied together at most: under a flood the listener still re-registers and
# sees the poller stop between batches, and a batch's reads stay bounded.
MAX_BATCH = 64
# How far beyond ``now + late margin + 2 x max skew`` a nudged row may be placed: the
# producer nudges rows placed up to 1 s beyond its ``now + late margin``, plus transit.
AHEAD_SLACK_MS = 2_000
# Rejected datagrams: the first is logged, then one summary line at most this often.
REJECTED_SUMMARY_S = 60.0


class Nudges:
    """Applies nudges to a poller's shards, and listens for them on a UDP socket."""

    def __init__(self, core: Core, prefetch_ms: int) -> None:
        self.core = core
        self.prefetch_ms = prefetch_ms
        self.sock: socket.socket | None = None
        self.address: str | None = None
        self._registered_at = -1e9
        self.bad = 0  # datagrams rejected (also scheduler_nudges_rejected_total)
        self._rejected = Summarised(log, "nudge_rejected", every_s=REJECTED_SUMMARY_S,
                                    monotonic=core.clock.monotonic)
        self._traced: set[type[BaseException]] = set()  # error types logged with a traceback

    def apply(self, entries: Iterable[Entry]) -> int:
        """Queue the nudged rows that qualify (see the module docstring); returns how
        many. Entries that cannot name a row this poller could take are skipped without
        a read: malformed ones (``check_entry``), those of shards it does not own, of
        recurring occurrences, of buckets its cursor has closed, with a bucket that does
        not hold their fire time, or placed beyond ``now + late margin + 2 x max skew +
        AHEAD_SLACK_MS``. A store error is reported to ``store_fault`` and the whole
        group is skipped: its rows take the usual path."""
        core, meta = self.core, self.core.meta
        latest = core.clock.now_ms() + meta.late_margin_ms + 2 * meta.max_skew_ms + AHEAD_SLACK_MS
        wanted: dict[tuple[int, int], set[Key]] = defaultdict(set)
        with core.cond:
            for e in entries:
                try:
                    shard, bucket, fire_ms, job_id = check_entry(e)
                except ValueError:
                    continue
                st = core.shards.get(shard)
                if (st is not None and st.reading and not job_id.startswith(OCCURRENCE_PREFIX)
                        and fire_ms <= latest and bucket == bucket_of_ms(fire_ms, meta.bucket_width_s)
                        and bucket >= st.progress.read_bucket):
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
        """The listener thread: receive, apply, re-register, until the poller stops.
        Nothing a datagram holds ends it (see ``_drain`` and ``_apply_batch``)."""
        core, sock = self.core, self.sock
        assert sock is not None
        self.register(force=True)
        while not core.stopping.is_set():
            self.register()
            try:
                data, source = sock.recvfrom(65535)
            except TimeoutError:
                continue
            except OSError:  # not from a datagram's content (the socket itself): retry
                core.stopping.wait(0.2)
                continue
            self._apply_batch(self._drain(data, source))

    def _drain(self, data: bytes, source: Any) -> list[tuple[list[Entry], Any]]:
        """The entries of ``data`` and of the datagrams already waiting, per datagram,
        ``MAX_BATCH`` datagrams at most; those that are not valid nudges are rejected
        (``_reject``) and left out."""
        sock = self.sock
        assert sock is not None
        groups: list[tuple[list[Entry], Any]] = []
        sock.setblocking(False)
        try:
            for n in range(1, MAX_BATCH + 1):
                try:
                    groups.append((decode(data), source))
                except ValueError as exc:
                    self._reject(source, str(exc))
                except Exception as exc:  # decode promises ValueError: a bug, not the sender's
                    self._reject(source, "decoding it", exc)
                if n == MAX_BATCH:  # the rest waits in the socket for the next batch
                    break
                try:
                    data, source = sock.recvfrom(65535)
                except OSError:  # BlockingIOError: nothing more waiting
                    break
        finally:
            sock.settimeout(0.2)
        return groups

    def _apply_batch(self, groups: list[tuple[list[Entry], Any]]) -> None:
        """Apply the entries of a batch of datagrams together (one read per range). If
        that raises (a bug: store errors are handled by ``apply``), each datagram is
        applied alone, so that one cannot cost the others their fast path, and those that
        raise again are rejected."""
        if not any(entries for entries, _ in groups):
            return
        try:
            self.apply([e for entries, _ in groups for e in entries])
        except Exception:
            for entries, source in groups:
                try:
                    self.apply(entries)  # rows taken by the first try are not taken twice
                except Exception as exc:
                    self._reject(source, "applying it", exc)

    def _reject(self, source: Any, reason: str, exc: Exception | None = None) -> None:
        """Count a datagram that was not a valid nudge, or that raised: the first is
        logged, the next ones summarised every ``REJECTED_SUMMARY_S``; an exception's
        traceback is logged once per type (it is a bug)."""
        self.bad += 1
        self.core.metrics.nudges_rejected.inc()
        sender = ":".join(map(str, source[:2])) if isinstance(source, tuple) else str(source)
        if exc is not None and type(exc) not in self._traced:
            self._traced.add(type(exc))
            log.error("a datagram from %s on %s raised %s (%s) while %s; ignored, the listener "
                      "goes on (the traceback is logged once per error type)", sender, self.address,
                      type(exc).__name__, exc, reason, exc_info=exc,
                      extra={"action": "nudge_failed", "poller": self.core.name})
            return
        if exc is not None:
            reason = f"{reason}: {type(exc).__name__}: {exc}"
        self._rejected.event(f"ignored a datagram from {sender} on {self.address} that is not a "
                             f"valid nudge ({reason}); counted in scheduler_nudges_rejected_total")

    def close(self) -> None:
        """Stop listening and remove our address (best effort)."""
        if self.sock is not None:
            self.sock.close()
        # Not while the store fails (a stop must not wait for its timeouts): the row's
        # TTL removes it, and producers meanwhile only lose the fast path.
        if self.address is not None and not self.core.store_fault.failing:
            with contextlib.suppress(SchedulerError):
                self.core.store.set_notify_endpoint(self.core.name, None, self.core.clock.now_ms())
