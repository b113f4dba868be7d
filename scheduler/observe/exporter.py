"""``scheduler exporter``: per-shard lag and due backlog read from the store and served
as Prometheus metrics, so lag is visible when every poller is dead.

A background thread refreshes checkpoints, owners and backlog every ``interval_s``.
Lag is computed at scrape time from the last checkpoints read, so when the store or
ZooKeeper cannot be read the lag keeps growing (the safe direction) and
``scheduler_exporter_up`` drops to 0.

With ``audit_interval_s`` a second thread audits the last closed hour (``audit.py``)
that often and exports what it found (``scheduler_audit_violations``); an audit reads
every partition of the hour, so it runs apart from the lag refresh and never delays it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..domain.clock import Clock
from ..errors import SchedulerError
from ..fleet.view import FleetSnapshot
from ..store.roles import ExporterReads
from .audit import AuditReport, audit, last_closed_hour
from .lag import ShardLag, lag_report
from .metrics import add_process_metrics

log = logging.getLogger("scheduler.exporter")


class Spell:
    """A loop's failures, logged once per spell of failures and per exception type (an
    unexpected one with its traceback: a bug that starts during a store outage is still
    seen), and the spell's end once. The loop's error counter tells how many there were."""

    def __init__(self, what: str, action: str, ok_action: str) -> None:
        self.what, self.action, self.ok_action = what, action, ok_action
        self._seen: set[str] = set()

    def failed(self, exc: BaseException) -> None:
        kind = type(exc).__name__  # a store error turning into another kind is logged too
        if kind in self._seen:
            return
        self._seen.add(kind)
        if isinstance(exc, SchedulerError):
            log.warning("%s failed: %s", self.what, exc, extra={"action": self.action})
        else:
            log.error("%s failed unexpectedly (%s)", self.what, kind, exc_info=exc,
                      extra={"action": self.action})

    def ok(self) -> None:
        if self._seen:
            log.info("%s works again", self.what, extra={"action": self.ok_action})
            self._seen.clear()


class LagExporter:
    def __init__(self, store: ExporterReads, clock: Clock,
                 fleet: Callable[[], FleetSnapshot | None] = lambda: None,
                 interval_s: float = 15.0, audit_interval_s: float | None = None) -> None:
        self.store, self.clock, self.read_fleet, self.interval_s = store, clock, fleet, interval_s
        self.audit_interval_s = audit_interval_s
        self._audit: tuple[AuditReport, float, float] | None = None  # report, when, seconds
        self._audit_errors = 0
        self.registry = CollectorRegistry()
        add_process_metrics(self.registry)
        self._rows: list[ShardLag] = []
        self._members: int | None = None
        self._shard_count = 0
        self._up = 0
        self._errors = 0
        self._last_ok = 0.0
        self._duration = 0.0
        self._lock = threading.Lock()
        # Recurring schedules: checked every ``recurring_interval_s`` (a scan of the
        # schedules table and two key reads per schedule).
        self.recurring_interval_s = max(interval_s, 60.0)
        self._recurring: dict[str, int] | None = None
        self._recurring_at = -1e9
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._fleet_spell = Spell("reading the fleet", "exporter_fleet_failed", "exporter_fleet_ok")
        self._recurring_spell = Spell("reading the schedules", "exporter_recurring_failed",
                                      "exporter_recurring_ok")
        self.registry.register(self)

    def refresh(self) -> None:
        """Read everything once. A failed lag read raises its exception (the store's
        ``SchedulerError``, or any other) after recording it (``up`` 0, error counter);
        the previous figures stay. A failed fleet or schedules read only counts an error
        and keeps going: lag is read without them (owners from the checkpoints, the
        previous schedule counts)."""
        t0 = time.monotonic()
        try:
            fleet = self._fleet_or_none()
            rows = lag_report(self.store, self.clock.now_ms(), fleet)
            shard_count = self.store.layouts().latest.shard_count
        except Exception:  # a store error, or a bug: either way the figures are stale now
            with self._lock:
                self._up, self._errors = 0, self._errors + 1
            raise
        recurring = self._recurring
        if time.monotonic() - self._recurring_at >= self.recurring_interval_s:
            self._recurring_at = time.monotonic()  # failed or not: the next try is an interval on
            try:
                recurring = self._read_recurring()
                self._recurring_spell.ok()
            except Exception as exc:
                self._recurring_spell.failed(exc)
                with self._lock:
                    self._errors += 1
        with self._lock:
            self._rows, self._shard_count, self._up = rows, shard_count, 1
            self._recurring = recurring
            self._members = None if fleet is None else len(fleet.members)
            self._last_ok = self.clock.now_ms() / 1000
            self._duration = time.monotonic() - t0

    def _read_recurring(self) -> dict[str, int]:
        from .chains import broken_chains

        schedules = self.store.list_schedules()
        counts = {state: 0 for state in ("active", "paused")}
        for sch in schedules:
            if str(sch.state) in counts:
                counts[str(sch.state)] += 1
        counts["broken"] = len(broken_chains(self.store, self.clock.now_ms(), schedules))
        return counts

    def _fleet_or_none(self) -> FleetSnapshot | None:
        try:
            fleet = self.read_fleet()
        except Exception as exc:
            # Owners then come from the checkpoints' owner column; lag is unaffected.
            self._fleet_spell.failed(exc)
            with self._lock:
                self._errors += 1
            return None
        self._fleet_spell.ok()
        return fleet

    def run_audit(self) -> AuditReport:
        """Audit the last closed hour once and keep the result for the metrics. Raises
        the store's ``SchedulerError`` (or any other exception) after counting it; the
        previous result stays."""
        t0 = time.monotonic()
        start, end = last_closed_hour(self.clock.now_ms())
        try:
            report = audit(self.store, start, end)
        except Exception:
            with self._lock:
                self._audit_errors += 1
            raise
        with self._lock:
            self._audit = (report, self.clock.now_ms() / 1000, time.monotonic() - t0)
        if report.violations:
            log.error("audit of %s found %d lost jobs; run scheduler audit for the list",
                      report.window(), len(report.violations), extra={"action": "audit_violations"})
        return report

    def start(self) -> None:
        loops = [(self._loop, "lag-exporter")]
        if self.audit_interval_s:
            loops.append((self._audit_loop, "audit"))
        for target, name in loops:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _audit_loop(self) -> None:
        """Audit every interval until stopped; a failed audit never ends the loop."""
        assert self.audit_interval_s
        spell = Spell("audit", "audit_failed", "audit_ok")
        wait = 0.0  # the first audit at start, the next ones every interval
        while not self._stop.wait(wait):
            wait = self.audit_interval_s
            try:
                self.run_audit()
            except Exception as exc:  # the error counter tells the rest
                spell.failed(exc)
                continue
            spell.ok()

    def _loop(self) -> None:
        """Refresh every interval until stopped. A failed refresh never ends the loop:
        ``up`` is 0 and the error counter grows until one passes."""
        spell = Spell("refresh", "exporter_refresh_failed", "exporter_refresh_ok")
        while not self._stop.wait(self.interval_s):
            try:
                self.refresh()
            except Exception as exc:
                spell.failed(exc)
                continue
            spell.ok()

    # --- prometheus_client collector --------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            rows, members, up, errors = list(self._rows), self._members, self._up, self._errors
            last_ok, duration, shard_count = self._last_ok, self._duration, self._shard_count
            recurring, audited, audit_errors = self._recurring, self._audit, self._audit_errors
        if self.audit_interval_s:
            yield from _audit_metrics(audited, audit_errors)
        if recurring is not None:
            states = GaugeMetricFamily("scheduler_recurring_schedules", "Recurring schedules by state",
                                       labels=["state"])
            for state in ("active", "paused"):
                states.add_metric([state], recurring[state])
            yield states
            yield GaugeMetricFamily("scheduler_recurring_chains_broken",
                                    "Active schedules with no current occurrence: nothing fires again",
                                    value=recurring["broken"])
        now_s = self.clock.now_ms() / 1000
        lag = GaugeMetricFamily("scheduler_shard_lag_seconds",
                                "Now minus the end of the shard's last drained bucket (from the store)",
                                labels=["shard"])
        backlog = GaugeMetricFamily("scheduler_shard_due_backlog",
                                    "Jobs due, past the checkpoint and not fired", labels=["shard"])
        capped = GaugeMetricFamily("scheduler_shard_backlog_capped",
                                   "1 when the backlog count stopped at its scan limit (a lower bound)",
                                   labels=["shard"])
        owned = GaugeMetricFamily("scheduler_shard_owned", "1 when some poller holds the shard",
                                  labels=["shard"])
        overdue = GaugeMetricFamily(
            "scheduler_shard_oldest_due_seconds",
            "Age of the shard's oldest job that is due and not fired (0: none); grows when "
            "no poller fires the shard", labels=["shard"])
        for r in rows:
            label = [str(r.shard)]
            lag.add_metric(label, max(0.0, now_s - r.drained_until_ms / 1000))
            backlog.add_metric(label, r.backlog)
            capped.add_metric(label, 1 if r.backlog_capped else 0)
            owned.add_metric(label, 1 if r.owner else 0)
            age = 0.0 if r.oldest_due_ms is None else max(0.0, now_s - r.oldest_due_ms / 1000)
            overdue.add_metric(label, age)
        yield from (lag, backlog, capped, owned, overdue)
        yield GaugeMetricFamily("scheduler_layout_shards", "Shard count of the latest layout",
                                value=shard_count)
        if members is not None:
            yield GaugeMetricFamily("scheduler_fleet_pollers", "Pollers registered in ZooKeeper",
                                    value=members)
        yield GaugeMetricFamily("scheduler_exporter_up", "1 when the last refresh read the store",
                                value=up)
        yield GaugeMetricFamily("scheduler_exporter_last_refresh_timestamp_seconds",
                                "When the last successful refresh finished", value=last_ok)
        yield GaugeMetricFamily("scheduler_exporter_refresh_duration_seconds",
                                "How long the last successful refresh took", value=duration)
        yield CounterMetricFamily("scheduler_exporter_refresh_errors",
                                  "Failed reads of the store or ZooKeeper", value=errors)


def _audit_metrics(audited: tuple[AuditReport, float, float] | None, errors: int) -> Iterator[Metric]:
    yield CounterMetricFamily("scheduler_audit_errors", "Audits that could not read the store",
                              value=errors)
    if audited is None:
        return
    report, at_s, duration = audited
    yield GaugeMetricFamily("scheduler_audit_violations",
                            "Lost jobs found by the last audit of the last closed hour: pending rows "
                            "behind their shard's checkpoint", value=len(report.violations))
    jobs = GaugeMetricFamily("scheduler_audit_jobs", "Jobs of the last audited hour by outcome",
                             labels=["outcome"])
    for outcome, n in report.totals().items():
        jobs.add_metric([outcome], n)
    yield jobs
    yield GaugeMetricFamily("scheduler_audit_last_run_timestamp_seconds",
                            "When the last audit finished", value=at_s)
    yield GaugeMetricFamily("scheduler_audit_duration_seconds", "How long the last audit took",
                            value=duration)
