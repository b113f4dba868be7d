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
        self.registry.register(self)

    def refresh(self) -> None:
        """Read everything once. Raises the ``SchedulerError`` of a failed read after
        recording it (``up`` 0, error counter); the previous figures stay."""
        t0 = time.monotonic()
        try:
            fleet = self._fleet_or_none()
            rows = lag_report(self.store, self.clock.now_ms(), fleet)
            shard_count = self.store.layouts().latest.shard_count
            recurring = self._recurring
            if time.monotonic() - self._recurring_at >= self.recurring_interval_s:
                recurring = self._read_recurring()
                self._recurring_at = time.monotonic()
        except Exception:  # a store error, or a bug: either way the figures are stale now
            with self._lock:
                self._up, self._errors = 0, self._errors + 1
            raise
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
            return self.read_fleet()
        except SchedulerError as exc:
            # Owners then come from the checkpoints' owner column; lag is unaffected.
            log.warning("cannot read the fleet: %s", exc, extra={"action": "exporter_fleet_failed"})
            with self._lock:
                self._errors += 1
            return None

    def run_audit(self) -> AuditReport:
        """Audit the last closed hour once and keep the result for the metrics. Raises
        the store's ``SchedulerError`` after counting it; the previous result stays."""
        t0 = time.monotonic()
        start, end = last_closed_hour(self.clock.now_ms())
        try:
            report = audit(self.store, start, end)
        except SchedulerError:
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
        assert self.audit_interval_s
        failing = False
        wait = 0.0  # the first audit at start, the next ones every interval
        while not self._stop.wait(wait):
            wait = self.audit_interval_s
            try:
                self.run_audit()
                failing = False
            except SchedulerError as exc:
                if not failing:  # once per outage; the error counter tells the rest
                    log.warning("audit failed: %s", exc, extra={"action": "audit_failed"})
                failing = True

    def _loop(self) -> None:
        """Refresh every interval until stopped. A failed refresh never ends the loop:
        it is logged once per spell of failures (the error counter and ``up`` tell the
        rest), and the first success after it is logged too."""
        failing = False
        while not self._stop.wait(self.interval_s):
            try:
                self.refresh()
            except SchedulerError as exc:
                if not failing:
                    log.warning("refresh failed: %s; retrying every %.0f s", exc, self.interval_s,
                                extra={"action": "exporter_refresh_failed"})
                failing = True
                continue
            except Exception:  # a bug must not stop the metrics: up stays 0 until it passes
                if not failing:
                    log.exception("refresh failed unexpectedly; retrying every %.0f s", self.interval_s,
                                  extra={"action": "exporter_refresh_failed"})
                failing = True
                continue
            if failing:
                log.info("refresh works again", extra={"action": "exporter_refresh_ok"})
            failing = False

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
