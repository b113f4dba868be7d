"""The poller: owns shards, drains them from their checkpoints and fires every due job.

It composes four roles, each in its own module, sharing one ``Core``:

- the *reader* (``reader.py``, one thread): reads each shard's buckets after its cursor
  into the due queue, saves checkpoints;
- the *dispatcher* (``dispatcher.py``, one thread): hands due jobs to the handlers when
  their fire time comes;
- the *workers* (``workers.py``, ``concurrency`` threads and a watchdog, or ``aio.py``,
  one event loop for coroutine handlers): run the handlers, within their timeouts;
- the *recorder* (``recorder.py``, one thread): writes outcomes, completes rows.

This class keeps the ownership of shards (their lifecycle is in ``shared.py``) and the
order of start and stop. Two words are kept apart: a shard is *released* (handed over
to another owner); a job is *dispatched* (handed to a handler).

Guarantees: a job is never handed to a handler before its fire time by the poller's
clock (and fire time >= due time). A row becomes complete only after its outcome is
recorded, and the checkpoint never passes an incomplete row, so a crash re-fires at most
the rows that were read and not yet recorded (the in-flight bound).

An unexpected exception in any thread fails the poller: it is logged once with
``action=thread_crashed``, ``failure`` says why, ``failed`` is set, and the poller
stops as ``stop`` does (checkpoints are not saved when the reader, which keeps them,
crashed). ``run_poller`` then returns ``EXIT_FAILED`` for a supervisor to restart it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Protocol

from ..domain.clock import Clock, SystemClock
from ..domain.dispatch import App, Outcome
from ..domain.model import Job
from ..domain.netguard import AllowList
from ..domain.progress import ShardProgress
from ..errors import OwnershipLost, SchedulerError
from ..observe.faults import FaultLog
from ..observe.metrics import PollerMetrics
from ..producer.wire import Entry
from ..store.roles import Checkpoints, Meta, Ownership
from .aio import AsyncWorkers
from .config import PollerConfig, PollerStats
from .dispatcher import Dispatcher
from .flow import FlowControl
from .httptargets import HttpTargets
from .mixed import MixedWorkers, make_workers
from .nudge import Nudges
from .occurrences import Occurrences
from .reader import Reader
from .recorder import Recorder
from .shared import Core, OwnedShard, PollerStore, ShardState
from .workers import ThreadWorkers

log = logging.getLogger("scheduler.poller")


class _Owner(Meta, Checkpoints, Ownership, Protocol):
    """What this class calls itself: settings, checkpoints, claims and releases."""


class Poller:
    def __init__(self, store: PollerStore, app: App, *, clock: Clock | None = None,
                 config: PollerConfig | None = None, name: str | None = None,
                 metrics: PollerMetrics | None = None, signing_secret: bytes | None = None) -> None:
        """``signing_secret``: the key that signs the requests of HTTP targets (None:
        their jobs fail, saying how to set one). Raises ``ConfigError`` for an app that
        mixes coroutine and plain handlers."""
        self.store: PollerStore = store
        self.app = app
        # Its own calls go through the narrower view (mypy holds it to that).
        self._store: _Owner = store
        self.clock: Clock = clock or SystemClock()
        self.config = config or PollerConfig()
        self.name = name or f"poller-{uuid.uuid4().hex[:8]}"
        self.metrics = metrics or PollerMetrics()
        self.meta = self._store.meta()
        self.failed = threading.Event()
        core = self.core = Core(store, self.clock, self.config, self.name, self.metrics, self.meta,
                                gates=Occurrences, on_failure=self._on_failure)
        self.metrics.store_failing.set_function(core.store_fault.failing_for)
        assert isinstance(core.gates, Occurrences)
        self.occurrences = core.gates
        self.reader = Reader(core, on_lost=self.lose, on_rows=self.occurrences.write_successors)
        # The built-in kind http (unless the app has its own handler for it).
        config = self.config
        self.http = HttpTargets(
            allow=config.http_allow or AllowList(), secret=signing_secret, metrics=self.metrics,
            clock=self.clock,
            timeout_s=app.http_options().timeout_s,
            max_connections=config.concurrency + config.queue_ahead)
        # An async app's loop takes the next due jobs itself (see aio.py).
        self.workers: ThreadWorkers | AsyncWorkers | MixedWorkers = make_workers(core, app, self.http)
        self.dispatcher = Dispatcher(core, self.workers)
        self.recorder = Recorder(core)
        self.flow = FlowControl(core)
        self.nudges = Nudges(core, self.reader.prefetch_ms)
        self._wake = threading.Event()  # set to poll before the interval is up
        self._threads: list[threading.Thread] = []
        self._stop_lock = threading.Lock()
        self._stop_began = False
        self._stop_done = threading.Event()

    # --- views ----------------------------------------------------------------------

    @property
    def stats(self) -> PollerStats:
        return self.core.stats

    @property
    def store_fault(self) -> FaultLog:
        return self.core.store_fault

    @property
    def lease(self) -> Callable[[], bool]:
        return self.core.lease

    @lease.setter
    def lease(self, fn: Callable[[], bool]) -> None:
        self.core.set_lease(fn)

    @property
    def behind(self) -> bool:
        return self.reader.behind

    @property
    def prefetch_ms(self) -> int:
        return self.reader.prefetch_ms

    @property
    def refusing(self) -> str | None:
        """Why firing is paused, or None."""
        return self.core.paused_reason

    @property
    def failure(self) -> str | None:
        """Why the poller failed (a thread crashed, too many hung handlers), or None."""
        return self.core.failure

    @property
    def shards(self) -> set[int]:
        with self.core.cond:
            return set(self.core.shards)

    def state(self, shard: int) -> ShardState | None:
        """The shard's lifecycle state: current if held, else how it ended (released or
        lost) until it is claimed again; None for a shard never held."""
        with self.core.cond:
            st = self.core.shards.get(shard)
            return st.state if st is not None else self.core.ended.get(shard)

    def in_flight(self) -> int:
        """Jobs dispatched whose outcome is not recorded yet."""
        return self.core.flight.in_flight()

    # --- ownership ------------------------------------------------------------------

    def claim(self, shard: int, epoch: int | None = None, *, global_fence: bool = False,
              ceiling: Callable[[], int | None] | None = None) -> int:
        """Start draining ``shard`` under fencing token ``epoch`` (from the coordinator;
        None, without one: the stored epoch + 1); returns the claimed checkpoint's drained
        bucket. Raises ``OwnershipLost`` when another owner holds it with a newer epoch.
        ``ceiling``: the coordinator's ``token_ceiling``; a released shard whose epoch is
        above it (set under another coordinator) is taken at ``epoch``.
        ``global_fence``: as the store's ``claim_shard``."""
        core = self.core
        if epoch is None:
            current = {c.shard: c.owner_epoch for c in self._store.checkpoints()}
            epoch = current.get(shard, 0) + 1
        initial = self.meta.origin_bucket - self.meta.bucket_width_s
        fence = {"global_fence": True} if global_fence else {}
        try:
            cp = self._store.claim_shard(shard, self.name, epoch, initial, self.clock.now_ms(), **fence)
        except OwnershipLost as exc:
            # Refused by a released shard (the fencing read's holder and epoch) whose
            # epoch no token issued so far can reach (above the ceiling): set under another
            # coordinator (a run without ZooKeeper counts from the clock; a new ensemble
            # restarts its transaction ids). Nobody holds it, so it is taken at this token,
            # only while still released at that epoch. An epoch within the ceiling is a
            # newer holder's: refused, as is a shard with an owner, and every claim
            # without a coordinator (no ceiling).
            stored = exc.held_epoch
            if ceiling is None or exc.holder is not None or stored is None or stored <= epoch:
                raise
            top = ceiling()
            if top is None or stored <= top:
                raise
            now_ms = self.clock.now_ms()
            cp = self._store.take_released_shard(shard, self.name, epoch, stored, now_ms, **fence)
            log.warning("took released shard %d at epoch %d, below its stored epoch %d (set under "
                        "another coordinator)", shard, epoch, stored,
                        extra={"action": "shard_epoch_lowered", "shard": shard, "epoch": epoch,
                               "stored_epoch": stored, "poller": self.name})
        with core.cond:
            core.shards[shard] = OwnedShard(ShardProgress(shard, self.meta.bucket_width_s, cp), epoch, cp)
            core.ended.pop(shard, None)
            self.metrics.owned_shards.set(len(core.shards))
            core.cond.notify_all()
        self._wake.set()  # read the new shard now, not at the next tick
        log.info("claimed shard %d at bucket %d", shard, cp.drained,
                 extra={"action": "shard_claimed", "shard": shard, "epoch": epoch,
                        "checkpoint": cp.drained, "poller": self.name})
        return cp.drained

    def release(self, shard: int, timeout_s: float | None = None) -> None:
        """Hand ``shard`` over (planned): stop reading it, drop its queued jobs, wait for
        its in-flight jobs (up to the timeout), save the checkpoint, clear the owner."""
        core = self.core
        deadline = self.clock.monotonic() + (timeout_s if timeout_s is not None
                                             else self.config.shutdown_timeout_s)
        with core.cond:
            st = core.shards.get(shard)
            if st is None or not st.reading:
                return
            st.move(ShardState.RELEASING)
            # Queued rows stay incomplete, so the saved checkpoint stops before them and
            # the next owner reads them again.
            core.due.discard_shard(shard)
            while st.running and self.clock.monotonic() < deadline and not core.stopped.is_set():
                core.cond.wait(0.05)
        if self._finish_release(shard, st, save=True):
            log.info("released shard %d", shard, extra={"action": "shard_released", "shard": shard,
                                                         "checkpoint": st.saved.drained})

    def _finish_release(self, shard: int, st: OwnedShard, save: bool) -> bool:
        """A releasing shard's last steps: save its checkpoint (if ``save``), mark it
        released, clear the owner in the store. False when it was lost meanwhile (the
        checkpoint write was refused)."""
        core = self.core
        if save:
            self.reader.save_checkpoint(shard, st)
        with core.cond:
            if core.shards.get(shard) is not st:
                return False
            del core.shards[shard]
            st.move(ShardState.RELEASED)
            core.ended[shard] = ShardState.RELEASED
            self.metrics.owned_shards.set(len(core.shards))
        self.metrics.forget_shard(shard)
        self._clear_owner(shard, st.epoch)
        return True

    def _clear_owner(self, shard: int, epoch: int) -> None:
        """Clear the shard's owner in the store; best effort (the next claim fences anyway)."""
        try:
            if not self._store.release_shard(shard, epoch, self.clock.now_ms()):
                self.metrics.fencing_refusals.inc()
                log.warning("release of shard %d refused: epoch %d no longer owns it", shard, epoch,
                            extra={"action": "fencing_refused", "shard": shard, "epoch": epoch})
        except SchedulerError as exc:
            log.warning("could not clear owner of shard %d: %s", shard, exc,
                        extra={"action": "shard_release_failed", "shard": shard})

    def lose(self, shard: int, reason: str, *, fenced: bool = True) -> None:
        """Ownership moved (``fenced``: a fenced write was refused) or is given up
        without a word to the store (it cannot be reached): drop everything of the
        shard without writing for it again. Its unrecorded rows stay for the next owner."""
        core = self.core
        with core.cond:
            st = core.shards.pop(shard, None)
            if st is None:
                return
            st.move(ShardState.LOST)
            core.ended[shard] = ShardState.LOST
            core.due.discard_shard(shard)
            self.metrics.owned_shards.set(len(core.shards))
            core.stats.lost_shards.append(shard)
        self.metrics.forget_shard(shard)
        if fenced:
            self.metrics.fencing_refusals.inc()
        # Given up (not fenced): the caller logs one line for all of them.
        log.log(logging.WARNING if fenced else logging.INFO, "lost shard %d: %s", shard, reason,
                extra={"action": "shard_lost", "shard": shard, "epoch": st.epoch})

    # --- one step of each role (the contract tests drive these by hand) --------------

    def poll_once(self) -> int:
        """See ``Reader.poll_once``."""
        return self.reader.poll_once()

    def dispatch_ready(self) -> list[Job]:
        """The jobs that may be dispatched now (``Dispatcher.due_jobs``); the caller
        fires each one with ``fire``."""
        return self.dispatcher.due_jobs()

    def fire(self, job: Job) -> Outcome:
        """Run the handler of one job in this thread and queue its outcome for recording."""
        return self.workers.fire_inline([job])[0]

    def nudge(self, entries: Iterable[Entry]) -> int:
        """See ``Nudges.apply`` (the listener thread calls it for each datagram)."""
        return self.nudges.apply(entries)

    def record_outcomes(self, block_s: float = 0.0) -> int:
        """See ``Recorder.record_outcomes``."""
        return self.recorder.record_outcomes(block_s)

    # --- lifecycle ------------------------------------------------------------------

    def start(self, shards: Iterable[int] = (), epoch: int | None = None) -> None:
        """Claim ``shards`` and start the threads."""
        for shard in shards:
            self.claim(shard, epoch)
        core = self.core
        # Bound before any thread starts: a thread that crashes at once stops the poller,
        # and that stop closes the listener; bound after it, the socket would stay open.
        listening = False
        if self.config.notify_address:
            try:
                self.nudges.bind(self.config.notify_address)
            except OSError as exc:
                log.warning("cannot listen for nudges on %s (%s): due-now jobs fire at now + late "
                            "margin; set another address", self.config.notify_address, exc,
                            extra={"action": "nudge_unavailable", "poller": self.name})
            else:
                listening = True
        self.workers.start()
        core.flow_ready.clear()  # nothing starts before the limits and pauses are read
        self._threads += [core.start_thread("flow", self.flow.run),
                          core.start_thread("dispatch", self.dispatcher.run),
                          core.start_thread("recorder", self.recorder.run),
                          core.start_thread("reader", lambda: self.reader.run(self._nap))]
        if listening:
            self._threads.append(core.start_thread("nudge", self.nudges.run))

    def _nap(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def _on_failure(self, role: str) -> None:
        self.failed.set()
        save = role != "reader"  # the reader's state is what a checkpoint is made of
        threading.Thread(target=self.stop, kwargs={"save": save}, name=f"{self.name}-failstop",
                         daemon=True).start()

    def stop(self, timeout_s: float | None = None, *, save: bool = True) -> None:
        """Graceful shutdown: stop reading and dispatching, let in-flight handlers finish
        (up to the timeout), record their outcomes, save checkpoints (unless ``save`` is
        False), release shards. A second call waits for the first to finish."""
        with self._stop_lock:
            began, self._stop_began = self._stop_began, True
        if began:
            self._stop_done.wait(self.config.shutdown_timeout_s + 15)
            return
        try:
            self._stop(self.config.shutdown_timeout_s if timeout_s is None else timeout_s, save)
        finally:
            self._stop_done.set()

    def _stop(self, timeout: float, save: bool) -> None:
        core = self.core
        core.stopping.set()
        self._wake.set()
        with core.cond:
            core.due.drain()  # unfired rows stay in the store, after the checkpoint
            core.cond.notify_all()
        deadline = self.clock.monotonic() + timeout
        while self.in_flight() > 0 and self.clock.monotonic() < deadline and not core.stopped.is_set():
            core.stopping.wait(0.02)
        self.workers.stop()
        while self.record_outcomes() > 0:  # -1: the store failed; the rows stay unrecorded
            pass
        core.stopped.set()
        # Abandoned workers (hung handlers) never end: the joins share one deadline.
        join_until = time.monotonic() + 2
        for t in [*self._threads, *self.workers.threads]:
            if t is not threading.current_thread():
                t.join(timeout=max(0.0, join_until - time.monotonic()))
        self.nudges.close()
        if core.gates is not None:
            core.gates.close()
        for shard in sorted(self.shards):
            with core.cond:
                st = core.shards.get(shard)
                if st is None or not st.reading:
                    continue
                st.move(ShardState.RELEASING)
            self._finish_release(shard, st, save)
        log.info("poller stopped", extra={"action": "poller_stopped", "poller": self.name,
                                          "fired": core.stats.fired, "nudged": core.stats.nudged,
                                          "retired_dropped": core.stats.retired_dropped})
