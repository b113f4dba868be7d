"""What the poller's threads share: the owned shards and their lifecycle, the due queue,
the count of jobs in flight, and the failure that stops the poller.

Lifecycle of a shard (``ShardState``)::

    claimed --> draining --> releasing --> released
       |           |             |
       +-----------+-------------+------> lost

- *claimed*: its checkpoint was read and our epoch written; nothing read yet.
- *draining*: the reader reads its buckets after the checkpoint, oldest first.
- *releasing*: a planned hand-over (``Poller.release``): nothing new is read, its
  queued jobs are dropped, its in-flight jobs finish and are recorded.
- *released*: its checkpoint is saved and its owner cleared in the store.
- *lost*: a fenced write was refused (another owner has a newer epoch), or it was
  given up without a word to the store. Nothing more is written for it; its unrecorded
  rows stay for the next owner.

Released and lost are final: a shard claimed again starts a new lifecycle.
"""

from __future__ import annotations

import logging
import queue
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from ..domain.clock import Clock
from ..domain.dispatch import Outcome
from ..domain.layout import Layouts
from ..domain.model import Job
from ..domain.progress import Checkpoint, ShardProgress
from ..observe.faults import FaultLog
from ..observe.metrics import PollerMetrics
from ..store import StoreMeta
from ..store.roles import (
    BucketReads,
    Checkpoints,
    Firing,
    Flow,
    JobReads,
    JobWrites,
    Meta,
    Ownership,
    Schedules,
)
from .config import PollerConfig, PollerStats
from .duequeue import DueQueue
from .flowqueue import FlowQueue

log = logging.getLogger("scheduler.poller")


class ShardState(Enum):
    CLAIMED = "claimed"
    DRAINING = "draining"
    RELEASING = "releasing"
    RELEASED = "released"
    LOST = "lost"


NEXT_STATES: dict[ShardState, frozenset[ShardState]] = {
    ShardState.CLAIMED: frozenset({ShardState.DRAINING, ShardState.RELEASING, ShardState.LOST}),
    ShardState.DRAINING: frozenset({ShardState.RELEASING, ShardState.LOST}),
    ShardState.RELEASING: frozenset({ShardState.RELEASED, ShardState.LOST}),
    ShardState.RELEASED: frozenset(),
    ShardState.LOST: frozenset(),
}


@dataclass
class OwnedShard:
    progress: ShardProgress
    epoch: int
    saved: Checkpoint
    state: ShardState = ShardState.CLAIMED
    running: int = 0  # jobs dispatched whose outcome is not recorded yet

    def move(self, to: ShardState) -> None:
        """Change state; a transition the lifecycle does not have is a bug."""
        if to is not self.state and to not in NEXT_STATES[self.state]:
            raise AssertionError(f"shard {self.progress.shard}: {self.state.value} -> {to.value}")
        self.state = to

    @property
    def reading(self) -> bool:
        return self.state in (ShardState.CLAIMED, ShardState.DRAINING)


class Flight:
    """Jobs dispatched and not finished, without a lock per job: the dispatcher counts
    what it handed out, each worker counts what it finished in a slot of its own, and in
    flight is the difference. Slot 0 is for inline ``Poller.fire`` calls and shutdown."""

    def __init__(self, cap: int) -> None:
        self.cap = cap  # in flight at most: running handlers plus due jobs queued for them
        # The dispatcher waits on ``free`` while ``want`` is set and more than this many
        # are in flight; workers set it once no more are.
        self.refill_at = cap // 2
        self.dispatched = 0
        self.finished: list[int] = [0]
        self.want = False
        self.free = threading.Event()

    def new_slot(self) -> int:
        self.finished.append(0)
        return len(self.finished) - 1

    def in_flight(self) -> int:
        return self.dispatched - sum(self.finished)

    def some_done(self) -> None:
        if self.want and self.in_flight() <= self.refill_at:
            self.free.set()


class PollerStore(Meta, Checkpoints, Ownership, BucketReads, Firing, JobReads, JobWrites, Schedules,
                  Flow, Protocol):
    """What a poller's threads call, together: every role of the store but the dead
    letters, the schema and the connection (its owner closes it). Each role narrows it
    to its own part (``Reader``, ``Recorder``, ``Poller``); ``JobWrites`` and ``JobReads``
    are for recurring occurrences, which write their successors as a producer does."""


class Gates(Protocol):
    """Recurring occurrences' decisions (``occurrences.Occurrences``): ``gate`` in a
    worker returns the outcome of each occurrence to skip or to let wait (absent: fire);
    ``pregate`` in the dispatcher makes those decisions for a whole dispatch at once."""

    def gate(self, jobs: list[Job]) -> dict[str, Outcome]: ...
    def pregate(self, jobs: list[Job]) -> None: ...
    def close(self) -> None: ...


class Core:
    """State shared by the reader, the dispatcher, the workers and the recorder. The
    condition ``cond`` guards ``shards``, ``due`` and each shard's progress.

    Its collaborators come in through the constructor: ``gates`` builds the recurring
    occurrences' gates from this core (they read its store, clock and settings; None:
    every job fires), ``on_failure`` starts the poller's shutdown once ``fail`` recorded
    a failure. Only ``set_lease`` changes one afterwards (a fleet joins after start)."""

    def __init__(self, store: PollerStore, clock: Clock, config: PollerConfig, name: str,
                 metrics: PollerMetrics, meta: StoreMeta, *,
                 gates: Callable[[Core], Gates] | None = None,
                 on_failure: Callable[[str], None] = lambda role: None) -> None:
        self.store, self.clock, self.config, self.name = store, clock, config, name
        self.metrics, self.meta = metrics, meta
        self.stats = PollerStats()
        # Every store call of every thread reports here: an outage is logged once, then
        # summarised every 30 s, and a fleet releases our shards when it lasts too long.
        self.store_fault = FaultLog(log, "the store", action="store")
        self.cond = threading.Condition()
        self.shards: dict[int, OwnedShard] = {}
        self.ended: dict[int, ShardState] = {}  # the final state of shards no longer held
        self.due = FlowQueue(DueQueue(config.max_rate, config.max_shard_rate, monotonic=clock.monotonic),
                             clock.monotonic, config.max_buffered)
        # Set once flow control's limits were read (``flow.FlowControl``): until then
        # nothing starts. Set from the start for a core whose poller runs no flow thread.
        self.flow_ready = threading.Event()
        self.flow_ready.set()
        self.flight = Flight(config.concurrency + config.queue_ahead)
        self.outcomes: queue.SimpleQueue[list[Outcome]] = queue.SimpleQueue()
        # Outcomes whose handlers returned, for flow control's running counts: a
        # handler's slot is free when it returns, not once the recorder wrote its outcome
        # (at thousands of jobs a second, those still waiting to be written would hold
        # the slots of a concurrency limit). Only while some kind has limits.
        self.returned: queue.SimpleQueue[list[Outcome]] = queue.SimpleQueue()
        self.stopping = threading.Event()  # no more reading or dispatching
        self.stopped = threading.Event()  # the recorder and the watchdog end too
        self.paused_reason: str | None = None  # why firing is refused (clock skew)
        # Set by a fleet (``set_lease``): False while the coordinator cannot vouch for
        # our ownership.
        self.lease: Callable[[], bool] = lambda: True
        self.failure: str | None = None
        self.on_failure = on_failure
        self._failure_lock = threading.Lock()
        self._layouts: Layouts | None = None
        self._layouts_at = -1e9
        # Last: the gates read this core's other fields when they run, never while built.
        self.gates = gates(self) if gates is not None else None
        # Recurring occurrences: None to fire, or the outcome of a skip or a wait (see
        # occurrences.py).
        self.gate: Callable[[list[Job]], dict[str, Outcome]] | None = (
            self.gates.gate if self.gates is not None else None)
        self.pregate: Callable[[list[Job]], None] | None = (
            self.gates.pregate if self.gates is not None else None)

    def set_lease(self, lease: Callable[[], bool]) -> None:
        """Fire only while ``lease()`` holds (a fleet's coordinator vouches for our
        ownership); until called, it always holds."""
        self.lease = lease

    def layouts(self) -> Layouts:
        """The shard layouts, re-read every ``layout_refresh_s``."""
        if self._layouts is None or self.clock.monotonic() - self._layouts_at >= self.config.layout_refresh_s:
            self._layouts = self.store.layouts()
            self._layouts_at = self.clock.monotonic()
        return self._layouts

    def handled(self, outcomes: list[Outcome]) -> None:
        """Hand outcomes of jobs whose handlers ran to the recorder (and, while some kind
        has limits, to flow control's running counts)."""
        self.outcomes.put(outcomes)
        if self.due.limits:  # read without the lock: a hint; the recorder counts them too
            self.returned.put(outcomes)

    def requeue(self, jobs: list[Job], slot: int) -> None:
        """Put dispatched jobs that were not started back in the due queue (ownership in
        doubt, or handlers slow: see ``ThreadWorkers.fire_chunk``): dispatched again later,
        or dropped with their shard. Only a shard still read here takes them back: one
        being released (or lost) drops them, unfired, and its saved checkpoint stays
        before them, so its next owner fires them. The reader's cursor has passed them:
        they must not be forgotten while the shard is ours."""
        with self.cond:
            for job in jobs:
                st = self.shards.get(job.shard)
                self.due.finished(job)
                if st is not None:
                    st.running -= 1
                    if st.reading:
                        # A row taken ahead of its placed time (recalled, nudged) leaves
                        # at its due time again, not at the time it was placed at.
                        self.due.push(job, at_ms=min(job.fire_ms, job.due_ms))
            self.flight.finished[slot] += len(jobs)
            self.cond.notify_all()

    def fail(self, role: str, reason: str, exc: BaseException | None = None) -> None:
        """Record the poller's failure (the first only) and start its shutdown through
        ``on_failure``. Logged once, with the traceback when there is one."""
        with self._failure_lock:
            if self.failure is not None:
                return
            self.failure = reason
        tb = "".join(traceback.format_exception(exc)) if exc is not None else None
        log.error("%s; stopping the poller (a supervisor should restart it)%s", reason,
                  f"\n{tb}" if tb else "",
                  extra={"action": "thread_crashed" if exc is not None else "poller_failed",
                         "role": role, "poller": self.name})
        self.on_failure(role)

    def guarded(self, role: str, body: Callable[[], None]) -> Callable[[], None]:
        """``body`` as a thread target that turns an unexpected exception into the
        poller's failure instead of a thread that ends in silence."""
        def run() -> None:
            try:
                body()
            except BaseException as exc:
                self.fail(role, f"the {role} thread crashed: {type(exc).__name__}: {exc}", exc)
        return run

    def start_thread(self, role: str, body: Callable[[], None], label: str | None = None) -> threading.Thread:
        t = threading.Thread(target=self.guarded(role, body), name=f"{self.name}-{label or role}",
                             daemon=True)
        t.start()
        return t
