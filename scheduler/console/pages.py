"""What each console page shows, read through the library calls the CLI views use.

Every function here is bounded: it reads at most a fixed number of rows (``PAGE``) or a
window of at most ``MAX_WINDOW_MS``, whatever the keyspace holds. They raise the
library's typed errors (``InvalidInput``, ``JobNotFound``, ``StoreUnavailable``); the
app turns them into a page with one line saying what was wrong.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..domain.keys import from_ms, to_ms
from ..domain.model import LATEST_TIME, Job, parse_time
from ..errors import InvalidInput, SchedulerError
from ..fleet.view import FleetSnapshot
from ..observe.audit import last_closed_hour
from ..observe.faults import Summarised
from ..observe.lag import FleetStatus, ShardLag, bucket_rows, fleet_status, lag_report, parse_bucket
from ..producer.client import Client
from .history import Heatmap, LagHistory

log = logging.getLogger("scheduler.console")

PAGE = 100
DEAD_SCAN_PAGES = 10  # a filtered dead-letter page reads at most this many pages
MAX_WINDOW_MS = 3_600_000  # audit and re-fire windows: an hour at most from the console
LATEST_BUCKET_S = to_ms(LATEST_TIME) // 1000  # the last instant parse_time accepts


@dataclass
class FleetView:
    """The last sample of the fleet (the sampler thread refreshes it)."""
    at_ms: int = 0
    status: FleetStatus | None = None
    worst: list[ShardLag] = field(default_factory=list)
    shards: int = 0
    width_s: int = 60
    error: str | None = None


class Fleet:
    """Samples lag, owners and backlog every ``step_s`` in a thread, so that page views
    and their refreshes read memory, never the store (one ``lag_report`` per step,
    like the exporter's refresh)."""

    def __init__(self, client: Client, read_fleet: Callable[[], FleetSnapshot | None],
                 step_s: float = 30.0) -> None:
        self.client, self.read_fleet = client, read_fleet
        self.history = LagHistory(step_s=step_s)
        self.view = FleetView()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # A bug or a library's untyped error: logged once, then a line per SUMMARY_S.
        self._unexpected = Summarised(log, "console_read_failed")

    def sample(self) -> None:
        """Read once; never raises an ``Exception``. A failed read keeps the previous view
        and records the error, which the page shows (a typed error is logged once per
        outage, any other once and then summarised, not per sample)."""
        now = self.client.clock.now_ms()
        try:
            fleet = self.read_fleet()
            lags = lag_report(self.client.store, now, fleet)
            status = fleet_status(self.client.store, now, fleet, lags)
            width = self.client.store.meta().bucket_width_s
        except SchedulerError as exc:
            with self._lock:
                if self.view.error is None:
                    log.warning("console cannot read the fleet: %s", exc,
                                extra={"action": "console_read_failed"})
                self.view.error = str(exc)
            return
        except Exception as exc:  # any other: the thread must live on, and the page say so
            error = f"unexpected {type(exc).__name__}: {exc}"[:300]
            self._unexpected.event(f"console cannot read the fleet: {error}")
            with self._lock:
                self.view.error = error
            return
        with self._lock:
            self.history.add(now / 1000, {r.shard: r.lag_s for r in lags})
            self.view = FleetView(now, status, lags[:20], len(lags), width)

    def snapshot(self) -> FleetView:
        with self._lock:
            return self.view

    def heatmap(self) -> Heatmap:
        """Under the lock: the sampler appends to the history from its own thread."""
        with self._lock:
            return self.history.heatmap()

    def start(self) -> None:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="console-fleet", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.history.step_s):
            self.sample()


def bucket_page(client: Client, at: str, shard: int, after: str | None) -> dict[str, Any]:
    """At most PAGE rows of one partition, from the key ``after`` (``fire_ms:job_id``)."""
    store = client.store
    width = store.meta().bucket_width_s
    bucket = parse_bucket(at.strip(), width)
    if not 0 <= bucket <= LATEST_BUCKET_S:
        raise InvalidInput(f"bucket {bucket} is out of range: give a time between 1970-01-01 "
                           "and 9999-12-31 UTC")
    count = store.layouts().read_count(bucket)
    if not 0 <= shard < count:
        raise InvalidInput(f"shard {shard} is out of range: bucket {bucket} has shards 0-{count - 1}")
    key = None
    if after:
        ms, _, job_id = after.partition(":")
        if not job_id:
            raise InvalidInput("the page key must look like <fire ms>:<job id>; follow the Next link")
        # The store keeps times as signed 64-bit integers: a larger one is no key (sqlite overflows).
        key = (int_param("the page key's fire ms", ms, 0, 2**63 - 1), job_id)
    rows = bucket_rows(store, bucket, shard, PAGE, key)
    following = f"{rows[-1].fire_ms}:{rows[-1].job_id}" if len(rows) == PAGE else None
    return {"bucket": bucket, "from": from_ms(bucket * 1000).isoformat(), "shard": shard,
            "shard_count": count, "width": width, "rows": rows, "next": following}


def int_param(name: str, text: str, low: int, high: int) -> int:
    """``text`` as an integer of ``low``-``high`` (ASCII digits, an optional minus), or
    ``InvalidInput`` saying so in one line: never a number the store cannot hold."""
    digits = text.strip()
    if not (digits.removeprefix("-").isascii() and digits.removeprefix("-").isdigit()) or len(digits) > 20 \
            or not low <= int(digits) <= high:
        raise InvalidInput(f"{name} must be a whole number of {low}-{high}, got {text[:30]!r}")
    return int(digits)


def job_page(client: Client, job_id: str, now_ms: int) -> dict[str, Any]:
    job = client.get(job_id.strip())
    return {"job": job, "view": job.to_dict(), "lateness": lateness(job, now_ms)}


def lateness(job: Job, now_ms: int) -> tuple[int, str] | None:
    """``(ms, "late")``: how late it fired, for a job that fired at or after its due time;
    ``(ms, "overdue")``: how far past due a pending job is; None otherwise. A ``fired_ms``
    before ``due_ms`` belongs to an earlier life of the job (a replay or a re-schedule
    gave it a new due time and kept the old fired time): it says nothing about this one,
    and fired minus due would be a negative, absurd lateness."""
    pending = job.status.value == "pending"
    if job.fired_ms is not None and job.fired_ms >= job.due_ms and not pending:
        return job.fired_ms - job.due_ms, "late"
    if pending and now_ms > job.due_ms:
        return now_ms - job.due_ms, "overdue"
    return None


def schedules_page(client: Client, after: str | None) -> dict[str, Any]:
    page, following = client.recurring.page(after or None, PAGE)
    return {"schedules": [client.recurring.view(s) for s in page], "next": following}


def limits_page(client: Client) -> dict[str, Any]:
    """Every kind with a flow limit or a pause, by kind: one read (at most one row per
    kind). ``SchemaError`` on a store before the flow tables."""
    return {"limits": client.store.flow_limits()}


def dead_page(client: Client, kind: str, error: str, after: str | None) -> dict[str, Any]:
    """Dead letters matching the filters (kind exactly, error as a substring): up to PAGE
    of them, reading at most DEAD_SCAN_PAGES pages; ``next`` continues the scan."""
    out = []
    cursor = after or None
    for _ in range(DEAD_SCAN_PAGES):
        page = client.dead_letter_page(cursor, PAGE)
        for d in page:
            if (not kind or d.kind == kind) and (not error or error in (d.error or "")):
                out.append(d)
        cursor = page[-1].job_id if page else None
        if len(page) < PAGE or len(out) >= PAGE:
            break
    return {"dead": out, "next": cursor if cursor and len(page) == PAGE else None}


def window(start: str, end: str, now_ms: int) -> tuple[int, int]:
    """A window of at most an hour (default: the last closed hour)."""
    first, last = last_closed_hour(now_ms)
    first = to_ms(parse_time(start)) if start.strip() else first
    last = to_ms(parse_time(end)) if end.strip() else last
    if last < first:
        raise InvalidInput("'to' is before 'from'; give a window forwards in time")
    if last - first > MAX_WINDOW_MS:
        raise InvalidInput("the console audits and re-fires at most an hour at a time; "
                           "use scheduler audit / scheduler refire for longer windows")
    return first, last
