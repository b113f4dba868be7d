"""Flow control on one poller: every ``REFRESH_S`` it reads the fleet-wide limits and
pauses (one store read), publishes its own demand for each limited kind (jobs due and
waiting plus handlers running), reads every poller's, and sets its parts of each limit:
a max-min fair share of the rate (``domain.flow.share``) and of the concurrency
(``domain.flow.slots``). Every poller computes the same split from the same snapshot,
so the parts sum to the limit; a change made with ``scheduler limits`` or ``kinds``
reaches every poller within ``REFRESH_S`` plus a store read.

Under failure: a failed read or publish is logged once (then summarised) and the last
limits stay in force; the demand rows of a poller that stopped publishing age out after
``DEMAND_MAX_AGE_MS``, and until then its part stays unused (the fleet runs under the
limit, never over it). Until its first read succeeds a poller starts nothing
(``Core.flow_ready``): a paused kind must not fire from a poller that just started. A
store whose schema predates flow control has no limits: that is said once, and firing
goes on.
"""

from __future__ import annotations

import logging

from ..domain.flow import Limits, by_kind, fresh, share, slots
from ..domain.keys import bucket_of_ms
from ..domain.model import OCCURRENCE_PREFIX, Job
from ..errors import SchedulerError, SchemaError
from ..observe.faults import FaultLog
from ..store.base import PartRange
from .flowqueue import HOLD_S
from .shared import Core

log = logging.getLogger("scheduler.poller")

REFRESH_S = 1.0
# Demand rows older than this are ignored: a killed poller's part returns to the
# others within this time plus one refresh.
DEMAND_MAX_AGE_MS = 3000


class FlowControl:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.fault = FaultLog(log, "flow control's limits", action="flow_limits")
        self._old_schema_said = False
        self._kinds: set[str] = set()
        self._paused: set[str] = set()  # paused at the last read: a kind leaving it was resumed

    def refresh(self) -> bool:
        """One round: read, publish, split, apply. False when the store failed (the limits
        in force stay)."""
        core = self.core
        store = core.store
        try:
            rows = store.flow_limits()
        except SchemaError as exc:
            if not self._old_schema_said:
                self._old_schema_said = True
                log.warning("flow control is off: %s", exc, extra={"action": "flow_off"})
            core.flow_ready.set()
            return True
        except SchedulerError as exc:
            self.fault.failed(exc)
            return False
        limits = {lim.kind: lim for lim in rows}
        me = core.name
        with core.cond:
            queue = core.due
            waiting = queue.fair.waiting_kinds()
            mine: dict[str, tuple[int, int]] = {}
            for kind, lim in limits.items():
                if lim.rate_per_s is not None or lim.concurrency is not None:
                    gate = queue.gates.get(kind)
                    running = gate.running if gate is not None else 0
                    mine[kind] = (waiting.get(kind, 0) + running, running)
        now = core.clock.now_ms()
        snapshot: dict[str, dict[str, int]] = {}
        others_running: dict[str, int] = {}
        try:
            if mine:
                store.publish_demand(me, [(k, d, r) for k, (d, r) in sorted(mine.items())], now)
                seen = fresh(store.demands(now, DEMAND_MAX_AGE_MS), now, DEMAND_MAX_AGE_MS)
                snapshot = by_kind(seen)
                for row in seen:
                    if row.poller != me:
                        others_running[row.kind] = others_running.get(row.kind, 0) + row.running
        except SchedulerError as exc:
            self.fault.failed(exc)  # the limits still apply, split on my demand alone below
        else:
            self.fault.ok()
        metrics = core.metrics
        with core.cond:
            queue = core.due
            for kind, lim in limits.items():
                demands = snapshot.get(kind, {})
                demands[me] = mine.get(kind, (0, 0))[0]
                rate = None if lim.rate_per_s is None else share(lim.rate_per_s, demands, me)
                conc = None
                if lim.concurrency is not None:
                    # Never more than the others leave free: a poller whose part just
                    # shrank still runs its handlers, and they count until they end.
                    conc = min(slots(lim.concurrency, demands, me),
                               max(0, lim.concurrency - others_running.get(kind, 0)))
                queue.set_limits(lim, rate, conc)
                if rate is not None:
                    metrics.flow_limit.labels(kind, "rate").set(rate)
                if conc is not None:
                    metrics.flow_limit.labels(kind, "concurrency").set(conc)
            for kind in self._kinds - set(limits):
                queue.set_limits(Limits(kind), None, None)
                for which in ("rate", "concurrency"):
                    metrics.flow_limit.labels(kind, which).set(0)
            self._kinds = set(limits)
            paused = {kind for kind, lim in limits.items() if lim.paused}
            resumed, self._paused = self._paused - paused, paused
            for kind in queue.held_kinds():
                metrics.held.labels(kind).set(queue.held(kind))
        core.flow_ready.set()
        if resumed:
            self.bring_back(resumed)
        return True

    def bring_back(self, kinds: set[str]) -> int:
        """Queue now the held jobs of ``kinds`` (just resumed) that this poller's shards
        hold: read from where they were placed (the next ``HOLD_S``), at most
        ``max_buffered`` of them; any others come back at their placed time, within
        ``HOLD_S``. Returns how many were queued; a store error queues none (they too come
        back at their placed time)."""
        core = self.core
        meta, now = core.meta, core.clock.now_ms()
        width = meta.bucket_width_s
        until = now + int(HOLD_S * 1000) + meta.late_margin_ms + 1000
        first, last = bucket_of_ms(now, width), bucket_of_ms(until, width)
        with core.cond:
            shards = sorted(s for s, st in core.shards.items() if st.reading)
        parts: list[PartRange] = [(b, s, None, until) for s in shards for b in range(first, last + 1, width)]
        budget = core.config.max_buffered
        limit = core.config.read_limit
        found: list[Job] = []
        try:
            while parts and len(found) < budget:
                pages = core.store.read_buckets(parts, limit)
                more: list[PartRange] = []
                for (b, s, _after, _until), rows in zip(parts, pages, strict=True):
                    found += [r for r in rows if r.kind in kinds and r.fired_ms is None
                              and r.due_ms <= now and not r.job_id.startswith(OCCURRENCE_PREFIX)]
                    if len(rows) >= limit:
                        more.append((b, s, (rows[-1].fire_ms, rows[-1].job_id), until))
                parts = more
        except SchedulerError as exc:
            core.store_fault.failed(exc)
            return 0
        n = 0
        with core.cond:
            for row in sorted(found, key=lambda r: (r.due_ms, r.job_id))[:budget]:
                st = core.shards.get(row.shard)
                if st is not None and st.reading and st.progress.take_early(row.bucket,
                                                                            (row.fire_ms, row.job_id)):
                    core.due.push(row, at_ms=row.due_ms)
                    n += 1
            if n:
                core.cond.notify_all()
        if n:
            log.info("%d held jobs of %s queued after resume", n, ", ".join(sorted(kinds)),
                     extra={"action": "flow_resumed", "kinds": sorted(kinds), "jobs": n})
        return n

    def run(self) -> None:
        """The flow thread's body, until the poller stops."""
        core = self.core
        while not core.stopping.is_set():
            self.refresh()
            core.stopping.wait(REFRESH_S)
