"""The catch-up after a fail-back: a home-DC member that claims a shard back re-reads the
buckets the other DC drained while it held the shard, and moves every row still
unfired there ahead of the cursor, so it fires.

Why rows can be there: a producer in the home DC writes at LOCAL_QUORUM, which the
home DC alone acknowledges. A row written just before that DC went dark may not have
reached the other DC when the other DC's member took the shard over and drained the
row's bucket, so that member never saw it. Back home, the row is readable again (the
home DC's replicas have it), but the checkpoint has passed it: only a re-read finds it.

The same holds the other way round when the home DC's own copies were away (its nodes
down or cut off): what the other DC wrote meanwhile reaches them by hinted hand-off
after their return, and a home member that reads a bucket before its hints arrive reads
past those rows too.

What is read: that one shard's buckets from the take-over record's ``from_bucket`` (the
checkpoint at the take-over) to the bucket its checkpoint is in when the read starts
(at least ``to_bucket``, the checkpoint at the fail-back), at the member's own
consistency, ``SETTLE_S`` after the claim, and once no node of another DC is down (as
the driver sees them; ``PEERS_WAIT_S`` at most): by then the hints written while the
home DC was away (flushed every 10 s by default, then sent) have usually reached it,
rows and outcome marks alike. A row counts when the audit would
call it lost (``observe.audit.behind``: pending, its lookup row still naming it, at a
position the checkpoint has passed). Each is moved (``producer.repair.requeue``): same
id and due time, a new position ahead of every cursor, so it fires within the late
margin (at once when its owner takes the nudge). The record is then marked ``caught_up_ms`` with the
count moved, so a restart does not read the window twice; a member that dies before
that leaves the record for the next home claim, which reads it again (moving nothing
twice: a moved row is no longer pending where it was).

Failures (the store or ZooKeeper away) are logged once, then summarised, and the
window is tried again every ``RETRY_S``; nothing else waits on it. A record that holds
no window (not numbers where the window should be: written by hand, or by another
version) is logged as an error and skipped, so it cannot hold up the others.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from typing import Any

from ..domain.effects import run_sync
from ..errors import InvalidInput, SchedulerError
from ..fleet.coord import Coordinator
from ..observe.audit import behind
from ..observe.faults import FaultLog
from ..poller import Poller
from ..producer.repair import requeue

log = logging.getLogger("scheduler.fleet")

Pass = tuple[float, int, dict[str, Any], int, list[int]]

# Before a window is read: what the other DC wrote while this one was away reaches it by
# hinted hand-off within seconds of its return (Cassandra flushes hints every 10 s, then
# sends them), and the fail-back itself waited the fail-over delay with this DC healthy.
SETTLE_S = 15.0
# Passes again this long after a window is handed over: a hint that was slow to arrive
# (a backlog, a loaded node) lands behind the checkpoint after the first pass.
AGAIN_S = (60.0, 150.0)
RETRY_S = 5.0
# Buckets read, then moved, at a time: a producer's cancel or move between a row's read
# and its move is re-checked just before the move (``requeue``), and a stop waits for
# one chunk at most.
CHUNK_BUCKETS = 64
# A window waits this long at most for the other DCs' nodes to be back.
PEERS_WAIT_S = 600.0


class CatchUps:
    """A thread that catches up the windows handed to ``add``: each one ``settle_s``
    after it is handed over, and again ``again_s`` after (hints that arrived late)."""

    def __init__(self, poller: Poller, coord: Coordinator, *, settle_s: float = SETTLE_S,
                 again_s: tuple[float, ...] = AGAIN_S, retry_s: float = RETRY_S) -> None:
        self.poller, self.coord = poller, coord
        self.passes_s = (settle_s, *again_s)
        self.retry_s = retry_s
        # (when, order, record, pass, moved so far): the earliest due first
        self._todo: queue.PriorityQueue[Pass] = queue.PriorityQueue()
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._fault = FaultLog(log, "catching up a take-over window", action="catch_up")
        self._thread: threading.Thread | None = None
        self.moved = 0  # rows moved by this member's catch-ups, in all

    def add(self, records: list[dict[str, Any]]) -> None:
        """Catch up these windows: records from ``Coordinator.close_outages`` (marked
        caught up after each pass), or windows without a ``"node"`` (a cut link,
        ``PeerLinks``: nothing to mark). Starts the thread on first use."""
        now = time.monotonic()
        for record in records:
            self._todo.put((now + self.passes_s[0], next(self._seq), record, 0, [0]))
        if records and self._thread is None:
            self._thread = self.poller.core.start_thread("catch-up", self._loop)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=12)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                at, _, record, n, total = self._todo.get(timeout=0.5)
            except queue.Empty:
                continue
            if at > time.monotonic():  # not due yet: back, and look again soon
                self._todo.put((at, next(self._seq), record, n, total))
                self._stop.wait(min(0.5, at - time.monotonic()))
                continue
            self._wait_for_peers()
            self._run(record, n, total)

    def _run(self, record: dict[str, Any], n: int, total: list[int]) -> None:
        """Pass ``n`` over ``record``'s window, retried while the store or ZooKeeper
        fails; the record marked caught up (with the rows moved so far), and the next
        pass queued. A member that stops between passes does not make the later ones:
        what they would have found is left to the hourly audit."""
        last = n == len(self.passes_s) - 1
        while not self._stop.is_set():
            try:
                moved = self.catch_up(record)
                if moved is None:
                    return  # not ours now, or stopping: the next home claim does it
                total[0] += moved  # before the mark: its retry moves nothing and marks this
                if record.get("node") is not None:
                    self.coord.mark_caught_up(record, self.poller.clock.now_ms(), total[0])
                if not last:
                    at = time.monotonic() + self.passes_s[n + 1] - self.passes_s[n]
                    self._todo.put((at, next(self._seq), record, n + 1, total))
                self._fault.ok()
                return
            except (KeyError, TypeError, ValueError, OverflowError, InvalidInput) as exc:
                # A record without a window (written by hand, or not by this version):
                # trying again cannot help, and it must not hold up the others.
                log.error("outage record %s holds no window this version reads (%s); skipped: "
                          "audit its buckets by hand", str(record.get("node"))[:80], type(exc).__name__,
                          extra={"action": "catch_up_record_unreadable"})
                return
            except SchedulerError as exc:
                self._fault.failed(exc)
                self._stop.wait(self.retry_s)
            except Exception as exc:  # the driver after a shutdown, or a bug: one line
                if not self._stop.is_set():
                    log.error("catching up shard %s failed (%r); skipped", record.get("shard"), exc,
                              extra={"action": "catch_up_failed"})
                return

    def _wait_for_peers(self) -> None:
        """While nodes of another DC are down, their outcome marks (and rows) cannot
        have reached this DC: reading now would count rows they fired as unfired. Wait
        for them, ``PEERS_WAIT_S`` at most (a node dead for good must not stop every
        catch-up)."""
        give_up = time.monotonic() + PEERS_WAIT_S
        while self.poller.core.store.peers_down() > 0 and time.monotonic() < give_up:
            if self._stop.wait(1.0):
                return

    def catch_up(self, record: dict[str, Any]) -> int | None:
        """One pass: move the unfired rows of ``record``'s window ahead of the cursor, a
        chunk of buckets at a time; how many moved. None when the shard is not this
        member's (any more) or the worker stops: the record is then not marked, and the
        shard's next home claim hands it out again. Only the owner
        catches up, so two members never move the same row at once. Raises the store's
        or ZooKeeper's errors (then nothing is marked, and calling again is safe: a row
        moved already is not found again); ``KeyError``/``TypeError``/``ValueError``/
        ``OverflowError`` for a record that does not hold a window."""
        shard, first, last = int(record["shard"]), int(record["from_bucket"]), int(record["to_bucket"])
        if shard not in self.poller.shards:
            log.info("not catching up shard %d: it is not ours now", shard,
                     extra={"action": "catch_up_not_owner", "shard": shard})
            return None
        store = self.poller.core.store
        meta = self.poller.meta
        width = meta.bucket_width_s
        # Up to the checkpoint as it is now: the rows this member's own reader passed
        # before the hints brought them are behind it too.
        cp = next((c for c in store.checkpoints() if c.shard == shard), None)
        last = max(last, cp.drained + width) if cp is not None else last
        # Rows older than the retention are gone from the store: no need to read there,
        # and no record, however old or forged, makes this read more than that.
        first = max(first, last - meta.retention_s // width * width)
        producer = self.poller.occurrences.producer
        moved = 0
        for lo in range(first, last + 1, CHUNK_BUCKETS * width):
            if self._stop.is_set():
                return None
            rows = behind(store, shard, lo, min(last, lo + (CHUNK_BUCKETS - 1) * width))
            moved += len(run_sync(store, requeue(producer, rows)))
        self.moved += moved
        self.poller.metrics.caught_up.inc(moved)
        log.warning("caught up shard %d after %s: %d unfired rows moved ahead from buckets %d-%d",
                    shard, "its take-over" if record.get("node") is not None else "a cut to another DC",
                    moved, first, last,
                    extra={"action": "shard_caught_up", "shard": shard, "moved": moved,
                           "from_bucket": first, "to_bucket": last})
        return moved
