"""Flow control on one poller: every ``REFRESH_S`` it reads the fleet-wide limits and
pauses (one store read), publishes its own demand for each limited kind (jobs due and
waiting plus handlers running), reads every poller's, and sets its parts of each limit:
a max-min fair share of the rate (``domain.flow.share``) and of the concurrency
(``domain.flow.slots``), raised only by ``domain.flow``'s raise rule, so the parts in
force never sum over the limit; a change made with ``scheduler limits`` or ``kinds``
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
import math

from ..domain.flow import SETTLE_MS, Demand, Limits, fresh, may_raise, rate_part, slot_part
from ..errors import SchedulerError, SchemaError
from ..observe.faults import FaultLog
from .rows import by_partition, span, take_early
from .shared import Core

log = logging.getLogger("scheduler.poller")

REFRESH_S = 1.0
# The next round's delay while some part waits for the others to see this poller's row.
SETTLE_S = 0.25
# Rows read beyond the recalled ones in a span (other jobs placed at the same times).
RECALL_SLACK = 64
# Demand rows older than this are ignored: a killed poller's part returns to the
# others within this time plus one refresh. Long enough that a poller whose store calls
# take half a second each (three a round) still publishes well within it.
DEMAND_MAX_AGE_MS = 5000


class FlowControl:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.fault = FaultLog(log, "flow control's limits", action="flow_limits")
        self._old_schema_said = False
        self._kinds: set[str] = set()
        self._old_split_said = False
        # Until when (monotonic s) my last published parts are in force: my rows carry the
        # time of the read before the publish, and once the others may drop them as stale
        # (DEMAND_MAX_AGE_MS after it, less both clocks' skew) they may take my parts.
        self._parts_until: float | None = None
        # My parts in force, kept while the store fails: (kind, "rate"|"concurrency").
        self._parts: dict[tuple[str, str], float] = {}
        self.settling = False  # some kind's part waits to be seen: refresh again soon
        # Per kind, when (wall ms, after the publish) my part of it last rose.
        self._raised_ms: dict[str, int] = {}
        self._first_ms: dict[str, int] = {}  # per kind, when (wall ms) I first published it

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
        if self._parts_until is not None and not self._still_seen():
            self._start_over()
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
        read_at = core.clock.monotonic()  # my rows' age counts from here, not from the publish
        seen: list[Demand] = []
        ok, alone = bool(mine), False
        try:
            if mine:
                seen = fresh(store.demands(now, DEMAND_MAX_AGE_MS), now, DEMAND_MAX_AGE_MS)
        except SchemaError as exc:
            alone = self._no_split(exc)
            ok = False
        except SchedulerError as exc:
            self.fault.failed(exc)  # the parts in force stay until the store answers
            ok = False
        rows_of: dict[str, list[Demand]] = {}
        others_running: dict[str, int] = {}
        mine_seen = {row.kind: row for row in seen if row.poller == me}  # my rows the others read
        for row in seen:
            if row.poller != me:
                rows_of.setdefault(row.kind, []).append(row)
                others_running[row.kind] = others_running.get(row.kind, 0) + row.running
        # My parts first: they are published with my demand, so that the others raise
        # theirs only into what mine leave (domain.flow.rate_part, slot_part).
        parts: dict[str, float] = {}
        conc_parts: dict[str, int] = {}
        # Kinds with demand whose parts wait for the others to see mine (a poller
        # starting, a limit just set): refused for a moment, not throttled.
        settling: set[str] = set()
        keep = self._still_seen()  # unpublished, my parts in force stay while the others count them
        skew = core.meta.max_skew_ms
        for kind, lim in limits.items():
            if kind not in mine:  # only paused
                continue
            cur_rate = self._parts.get((kind, "rate"), 0.0)
            cur_conc = int(self._parts.get((kind, "concurrency"), 0))
            if alone or not ok:
                if lim.rate_per_s is not None:
                    parts[kind] = (lim.rate_per_s if alone
                                   else min(cur_rate, lim.rate_per_s) if keep else 0.0)
                if lim.concurrency is not None:
                    conc_parts[kind] = (lim.concurrency if alone
                                        else min(cur_conc, lim.concurrency) if keep else 0)
                continue
            demand, running = mine[kind]
            kind_rows = [*rows_of.get(kind, []), Demand(me, kind, demand, running, now, cur_rate, cur_conc)]
            shown = mine_seen.get(kind)
            first = self._first_ms.get(kind)
            visible = may_raise(rows_of.get(kind, ()), shown is not None, self._raised_ms.get(kind),
                                skew, first, now)
            if shown is None or first is None or now - first < SETTLE_MS:
                settling.add(kind)
            if lim.rate_per_s is not None:
                parts[kind] = rate_part(lim.rate_per_s, kind_rows, me, cur_rate, visible)
            if lim.concurrency is not None:
                conc_parts[kind] = slot_part(lim.concurrency, kind_rows, me, cur_conc, visible,
                                             None if shown is None else shown.demand)
        if ok:
            # Lowered parts are in force before the others can read them and take the room.
            self._apply(limits, {k: p for k, p in parts.items() if p < self._parts.get((k, "rate"), p)},
                        {k: n for k, n in conc_parts.items()
                         if n < self._parts.get((k, "concurrency"), n)},
                        settling, others_running, ok, lowering=True)
            try:
                store.publish_demand(me, [(k, d, r, parts.get(k), conc_parts.get(k))
                                          for k, (d, r) in sorted(mine.items())], now)
            except SchemaError as exc:
                alone = self._no_split(exc)
                ok = False
                parts = {k: limits[k].rate_per_s or 0.0 for k in parts}
                conc_parts = {k: limits[k].concurrency or 0 for k in conc_parts}
            except SchedulerError as exc:
                self.fault.failed(exc)
                ok = False  # unpublished, a raise could overlap another poller's: none
                parts = {k: min(p, self._parts.get((k, "rate"), 0.0)) for k, p in parts.items()}
                conc_parts = {k: min(n, int(self._parts.get((k, "concurrency"), 0)))
                              for k, n in conc_parts.items()}
            else:
                self.fault.ok()
                if self._parts_until is not None and not self._still_seen():
                    # The publish came too late: the others may have dropped my last rows
                    # and taken my parts meanwhile, so the parts computed from mine are void.
                    parts = dict.fromkeys(parts, 0.0)
                    conc_parts = dict.fromkeys(conc_parts, 0)
                    self._start_over()
                self._parts_until = read_at + (DEMAND_MAX_AGE_MS - 2 * skew) / 1000
                raised_at = core.clock.now_ms()
                for kind in mine:
                    self._first_ms.setdefault(kind, raised_at)
                    if (kind not in self._raised_ms
                            or parts.get(kind, 0.0) > self._parts.get((kind, "rate"), 0.0)
                            or conc_parts.get(kind, 0) > self._parts.get((kind, "concurrency"), 0)):
                        self._raised_ms[kind] = raised_at
                if raised_at - now > SETTLE_MS:
                    # A slow round: a poller that published meanwhile, unseen, may raise
                    # from a view without my raise. Published, the raise only makes the
                    # others take less; in force it waits for a quicker round.
                    parts = {k: min(p, self._parts.get((k, "rate"), 0.0)) for k, p in parts.items()}
                    conc_parts = {k: min(n, int(self._parts.get((k, "concurrency"), 0)))
                                  for k, n in conc_parts.items()}
        self._apply(limits, parts, conc_parts, settling, others_running, ok)
        metrics = core.metrics
        with core.cond:
            queue = core.due
            # Past this, limited kinds start nothing until a publish succeeds again, even
            # if this thread is stuck in a store call (the dispatcher checks it).
            until = self._parts_until
            queue.parts_until = math.inf if alone else 0.0 if until is None else until
            for kind in set(self._raised_ms) - set(mine):
                del self._raised_ms[kind]
                self._first_ms.pop(kind, None)
            # A part of a limit that is gone is forgotten: set again, it starts from 0.
            for kind, which in list(self._parts):
                now_lim = limits.get(kind)
                if now_lim is None or (now_lim.rate_per_s if which == "rate"
                                       else now_lim.concurrency) is None:
                    del self._parts[(kind, which)]
            for kind in self._kinds - set(limits):
                queue.set_limits(Limits(kind), None, None)
                for which in ("rate", "concurrency"):
                    metrics.flow_limit.labels(kind, which).set(0)
            self._kinds = set(limits)
            for kind in queue.held_kinds():
                # A resumed kind's held jobs come back at their placed time; from then
                # on they are no longer held, whatever the window still counts.
                held = limits.get(kind)
                metrics.held.labels(kind).set(queue.held(kind) if held is not None and held.paused else 0)
        self.settling = bool(settling)
        core.flow_ready.set()
        if not core.stopping.is_set():  # a stopping poller queues nothing more
            self.recall()
        return True

    def recall(self) -> int:
        """Queue now rows this poller placed later that their kind can start sooner (a
        raised rate, a resume; see ``FlowQueue.recall``), each read back first: one
        cancelled, rescheduled or fired meanwhile is not queued. Returns how many were
        queued; on a store error none (they come back at their placed time)."""
        core = self.core
        now = core.clock.now_ms()
        with core.cond:
            jobs = core.due.recall(now)
        if not jobs:
            return 0
        groups = by_partition(jobs)
        parts = [span(shard, bucket, keys) for (shard, bucket), keys in groups.items()]
        limit = max(map(len, groups.values())) + RECALL_SLACK
        try:
            found = core.store.read_buckets(parts, limit)
        except SchedulerError as exc:
            core.store_fault.failed(exc)
            with core.cond:
                core.due.placed(jobs)  # remembered again: tried on the next refresh
            return 0
        n = 0
        with core.cond:
            for ((shard, bucket), keys), rows in zip(groups.items(), found, strict=True):
                st = core.shards.get(shard)
                if st is None or not st.reading:
                    continue
                if len(rows) >= limit:  # a full page: those past it are tried again later
                    seen = {(r.fire_ms, r.job_id) for r in rows}
                    core.due.placed([job for key, job in keys.items() if key not in seen])
                n += take_early(core, st, bucket, keys, rows, now)
            if n:
                core.cond.notify_all()
        return n

    def _apply(self, limits: dict[str, Limits], parts: dict[str, float], conc_parts: dict[str, int],
               settling: set[str], others_running: dict[str, int], ok: bool,
               lowering: bool = False) -> None:
        """Put ``parts`` (rates) and ``conc_parts`` (slots) in force for every kind of
        ``limits`` (a kind in neither has no part: only paused). ``lowering``: only the
        kinds named change, the part they do not name stays as it is."""
        core = self.core
        metrics = core.metrics
        with core.cond:
            queue = core.due
            for kind, lim in limits.items():
                rate, conc = parts.get(kind), conc_parts.get(kind)
                if lowering:
                    if rate is None and conc is None:
                        continue
                    # The other part as it is (none yet: none, never the whole limit).
                    if rate is None and lim.rate_per_s is not None:
                        rate = self._parts.get((kind, "rate"), 0.0)
                    if conc is None and lim.concurrency is not None:
                        conc = int(self._parts.get((kind, "concurrency"), 0))
                if rate is not None:
                    self._parts[(kind, "rate")] = rate
                if conc is not None:
                    self._parts[(kind, "concurrency")] = conc
                    if ok and lim.concurrency is not None:
                        # Never more than the others leave free: a poller whose part just
                        # shrank still runs its handlers, and they count until they end.
                        conc = max(0, min(conc, lim.concurrency - others_running.get(kind, 0)))
                queue.set_limits(lim, rate, conc, settling=kind in settling)
                if rate is not None:
                    metrics.flow_limit.labels(kind, "rate").set(rate)
                if conc is not None:
                    metrics.flow_limit.labels(kind, "concurrency").set(conc)

    def _start_over(self) -> None:
        """Forget my parts and raises: the others may have dropped my rows and taken my
        parts, so I start again from none, as a poller that just started."""
        self._parts.clear()
        self._raised_ms.clear()
        self._first_ms.clear()

    def _still_seen(self) -> bool:
        """Whether the others still count my last published parts."""
        until = self._parts_until
        return until is not None and self.core.clock.monotonic() < until

    def _no_split(self, exc: SchemaError) -> bool:
        """The store's schema has the limits but not the published parts (before v009):
        each poller applies each limit as if it were alone (said once)."""
        if not self._old_split_said:
            self._old_split_said = True
            log.warning("flow control cannot split limits between pollers (%s): each poller applies "
                        "the whole limit until `scheduler schema apply` is run", exc,
                        extra={"action": "flow_no_split"})
        return True

    def run(self) -> None:
        """The flow thread's body, until the poller stops."""
        core = self.core
        # On until the poller has stopped, not only until it stops starting jobs: while a
        # graceful stop waits for running handlers, its rows must still count them, or
        # the others would take their slots and run beside them over the limit.
        while not core.stopped.is_set():
            try:
                self.refresh()
            except Exception as exc:  # a stored value no check foresaw must not stop firing
                self.fault.failed(f"{type(exc).__name__}: {exc}")
            # A part waiting to be seen is raised on the next round: soon, not in a second.
            core.stopped.wait(SETTLE_S if self.settling else REFRESH_S)
