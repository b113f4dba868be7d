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

Retired rows (the datagram's ``"r"`` list). A producer that moves a job (slow-write
repair, a reschedule) or cancels it retires its old bucket row (``fired_at`` set), but a
poller reads a row once: one that queued the old row before the change would fire it,
and the new row too. So the producer names the retired rows to their owner, which
re-reads those it still holds *queued* (not yet dispatched) and drops each one the store
shows retired, marking it complete so the checkpoint can pass it
(``scheduler_retired_dropped_total``). The store is the authority: a forged entry costs
at most a read, never a row the store shows pending. A row not queued is left alone: one
dispatched already runs (the duplicate this cannot prevent), one not read yet is read as
done by the cursor. What remains is a narrow race: a read of the cursor that returned
the old row before the change but queues it only after the re-check; then, as when the
datagram is lost, the old row fires once more (never a loss).

Hostile datagrams. Anyone who reaches the socket can send anything, so nothing a
datagram holds may end or stall the listener: ``decode_message`` raises only ``ValueError``;
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

from ..domain.keys import bucket_of_ms
from ..domain.model import OCCURRENCE_PREFIX, Job
from ..domain.progress import Key
from ..errors import SchedulerError, SchemaError
from ..observe.faults import Summarised
from ..producer.wire import Entry, check_entry, decode_message, parse_address
from .rows import span, take_early
from .shared import Core

log = logging.getLogger("scheduler.poller")

# One decoded datagram: its due-now entries, its re-check entries, and its sender.
Group = tuple[list[Entry], list[Entry], Any]

# A nudged range is read with this many rows to spare (other jobs placed in between).
READ_SLACK = 100
REGISTER_EVERY_S = 30.0
# Datagrams applied together at most: under a flood the listener still re-registers and
# sees the poller stop between batches, and a batch's reads stay bounded.
MAX_BATCH = 64
# How far beyond ``now + late margin + 2 x max skew`` a nudged row may be placed: the
# producer nudges rows placed up to 11 s beyond its ``now + late margin`` (a job moved
# by slow-write repair gets up to 10 s of room), plus transit.
AHEAD_SLACK_MS = 12_000
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

    def apply(self, entries: Iterable[Entry], recheck: Iterable[Entry] = ()) -> int:
        """Queue the nudged rows (``entries``) that qualify (see the module docstring), and
        drop the queued rows that ``recheck`` names and the store shows retired (see
        ``_drop``); returns how many rows were queued. Both are read in one call.
        Entries that cannot name a row this poller could take are skipped without a read:
        malformed ones (``check_entry``), those of shards it does not own, of recurring
        occurrences, of buckets its cursor has closed, with a bucket that does not hold
        their fire time, or placed beyond ``now + late margin + 2 x max skew +
        AHEAD_SLACK_MS``. Re-check entries are skipped without a read unless they name a
        row queued in the due queue of a shard this poller owns and reads. A store error
        is reported to ``store_fault`` and the whole group is skipped: its due rows take
        the usual path, and its retired rows stay queued (they may fire once more, as
        without nudges)."""
        core, meta = self.core, self.core.meta
        latest = self._horizon()
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
            queued = self._queued(recheck)
        # One range per nudged shard and bucket, one exact range per retired position.
        parts = [span(shard, bucket, keys) for (shard, bucket), keys in wanted.items()]
        recheck_parts = [span(shard, bucket, keys) for (shard, bucket, _f), keys in queued.items()]
        sizes = [*map(len, wanted.values()), *map(len, queued.values())]
        limit = min(core.config.read_limit, max(sizes, default=0) + READ_SLACK)
        try:
            # One concurrent read of every range: sequential reads made the listener
            # fall behind a steady stream of nudges.
            found = core.store.read_buckets(parts + recheck_parts, limit) if sizes else []
        except SchedulerError as exc:
            core.store_fault.failed(exc)
            return 0
        taken = 0
        for (bucket, shard, _after, _until), rows in zip(parts, found[:len(parts)], strict=True):
            taken += self._take(shard, bucket, wanted[(shard, bucket)], rows)
        if taken:
            core.metrics.nudged.inc(taken)
            core.stats.nudged += taken
        if queued:
            self._drop(queued, found[len(parts):])
        return taken

    def _horizon(self) -> int:
        """The latest time a nudged row may be placed at, or due at, to be taken: ``now +
        late margin + 2 x max skew + AHEAD_SLACK_MS``."""
        meta = self.core.meta
        return self.core.clock.now_ms() + meta.late_margin_ms + 2 * meta.max_skew_ms + AHEAD_SLACK_MS

    def _queued(self, recheck: Iterable[Entry]) -> dict[tuple[int, int, int], set[Key]]:
        """The valid ``recheck`` entries that name a job queued in the due queue, in the
        same shard and bucket, of a shard we own and read, by ``(shard, bucket,
        fire_ms)``. Call under ``cond``. One pass over the due queue, only when some
        entry is of such a shard."""
        core = self.core
        named: dict[Key, tuple[int, int]] = {}
        for e in recheck:
            try:
                shard, bucket, fire_ms, job_id = check_entry(e)
            except ValueError:
                continue
            st = core.shards.get(shard)
            if st is not None and st.reading:
                named[(fire_ms, job_id)] = (shard, bucket)
        out: dict[tuple[int, int, int], set[Key]] = defaultdict(set)
        for key, job in core.due.find(named.keys()).items():
            if named[key] == (job.shard, job.bucket):
                out[(job.shard, job.bucket, job.fire_ms)].add(key)
        return out

    def _drop(self, queued: dict[tuple[int, int, int], set[Key]], found: list[list[Job]]) -> int:
        """Of the rows ``queued`` names (read back as ``found``), remove from the due queue
        those the store shows retired (``fired_at`` set) that are still queued and of a
        shard we still own and read, and mark them complete so the checkpoint can pass
        them; returns how many. The store is the authority: a row it shows pending stays
        queued whatever a datagram said, and a row dispatched meanwhile is left to run."""
        core = self.core
        retired: set[Key] = set()
        for keys, rows in zip(queued.values(), found, strict=True):
            retired.update(key for row in rows
                           if row.fired_ms is not None and (key := (row.fire_ms, row.job_id)) in keys)
        if not retired:
            return 0
        with core.cond:
            reading = {shard for shard, st in core.shards.items() if st.reading}
            dropped = core.due.discard_many(
                {k for (shard, _b, _f), keys in queued.items() if shard in reading for k in keys & retired})
            for job in dropped:
                st = core.shards.get(job.shard)
                if st is not None:  # always (its shard is reading): ids are unique
                    st.progress.complete(job.bucket, (job.fire_ms, job.job_id))
            core.stats.retired_dropped += len(dropped)
        if dropped:
            core.metrics.retired_dropped.inc(len(dropped))
        return len(dropped)

    def _take(self, shard: int, bucket: int, keys: set[Key], rows: list[Job]) -> int:
        core = self.core
        # Any row due within the window a nudge may name (not only the read horizon): one
        # due in 2.5 s, placed at now + 3 s, leaves at its due time, not 0.5 s late.
        horizon = self._horizon()
        with core.cond:
            st = core.shards.get(shard)
            if st is None or not st.reading:
                return 0
            n = take_early(core, st, bucket, keys, rows, horizon)
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
        if core.stopping.is_set():  # stopped before this thread began: nothing to announce
            return
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

    def _drain(self, data: bytes, source: Any) -> list[Group]:
        """The due-now and re-check entries of ``data`` and of the datagrams already
        waiting, per datagram, ``MAX_BATCH`` datagrams at most; those that are not valid
        nudges are rejected (``_reject``) and left out."""
        sock = self.sock
        assert sock is not None
        groups: list[Group] = []
        sock.setblocking(False)
        try:
            for n in range(1, MAX_BATCH + 1):
                try:
                    groups.append((*decode_message(data), source))
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

    def _apply_batch(self, groups: list[Group]) -> None:
        """Apply the entries of a batch of datagrams together (one read per range). If
        that raises (a bug: store errors are handled by ``apply``), each datagram is
        applied alone, so that one cannot cost the others their fast path, and those that
        raise again are rejected."""
        if not any(entries or recheck for entries, recheck, _ in groups):
            return
        try:
            self._apply([e for entries, _, _ in groups for e in entries],
                        [e for _, recheck, _ in groups for e in recheck])
        except Exception:
            for entries, recheck, source in groups:
                try:
                    # Rows taken or dropped by the first try are not taken or dropped twice.
                    self._apply(entries, recheck)
                except Exception as exc:
                    self._reject(source, "applying it", exc)

    def _apply(self, entries: list[Entry], recheck: list[Entry]) -> int:
        # ``apply(entries)`` alone when nothing is to be re-checked: the call as it was
        # before re-checks, which wrappers of ``apply`` (tests, instrumentation) expect.
        return self.apply(entries, recheck) if recheck else self.apply(entries)

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
