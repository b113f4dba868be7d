"""The operators' commands: ``lag``, ``status``, ``inspect``, ``forecast``, ``exporter``,
``audit``.

They read the store (and ZooKeeper when the coordinator is one), never a poller, so they
work with the whole fleet down. Registered on the app of ``scheduler.cli.main.common``.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ..errors import InvalidInput
from ..observe.lag import parse_bucket, shard_ranges
from .common import (
    DURATION,
    TIME,
    JsonOpt,
    StoreOpt,
    app,
    cell,
    check_coordinator,
    duration,
    emit,
    errors,
    plain,
    store_for,
)


def _coordinator_given(value: str | None) -> str | None:
    """A ``--coordinator`` given on the command line, checked while it is parsed: a
    malformed one is one ``error:`` line before the command opens anything."""
    from ..fleet.url import check_coordinator_url

    check_coordinator_url(value)
    return value


CoordOpt = Annotated[str | None, typer.Option(
    "--coordinator", callback=_coordinator_given,
    help="zookeeper://h1:2181/root to read owners from ZooKeeper "
         "(default $SCHEDULER_COORDINATOR; local: from the checkpoints).")]


def _open(store: str | None, coordinator: str | None) -> tuple[Any, Any]:
    """The store (which must exist: these commands never create one), and a function
    reading the fleet from ZooKeeper (None for local). The coordinator URL is checked
    before the store is opened."""
    from ..fleet.view import read_fleet

    url = check_coordinator(coordinator)
    st = store_for(store)
    return st, (lambda: read_fleet(url))


def _fmt_lag(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


@app.command()
def lag(store: StoreOpt = None, coordinator: CoordOpt = None, as_json: JsonOpt = False,
        top: Annotated[int | None, typer.Option(help="Show only the N worst shards.")] = None) -> None:
    """One row per shard, worst first: owner, checkpoint, lag and due backlog."""
    from ..domain.clock import SystemClock
    from ..observe.lag import lag_report

    with errors():
        if top is not None and top < 1:
            raise InvalidInput(f"--top {top} must be at least 1 (leave it out to show every shard)")
        st, fleet = _open(store, coordinator)
        try:
            rows = lag_report(st, SystemClock().now_ms(), fleet())
        finally:
            st.close()
    rows = rows[:top] if top else rows
    data = [r.to_dict() for r in rows]

    def human() -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"checkpoint lag of {len(rows)} shards, worst first")
        for col in ("shard", "owner", "drained until", "lag", "due backlog"):
            table.add_column(col, justify="right" if col in ("shard", "lag", "due backlog") else "left")
        for r, d in zip(rows, data, strict=True):
            owner = cell(r.owner) if r.owner else "[red]none[/]"
            table.add_row(str(r.shard), owner, cell(d["drained_until"]), _fmt_lag(r.lag_s),
                          f"{r.backlog}{'+' if r.backlog_capped else ''}")
        Console().print(table)

    emit(data, as_json, human)


@app.command()
def status(store: StoreOpt = None, coordinator: CoordOpt = None, as_json: JsonOpt = False) -> None:
    """The fleet at a glance: pollers, shards per poller, layouts and the worst lag."""
    from ..domain.clock import SystemClock
    from ..domain.retention import format_duration
    from ..observe.lag import fleet_status

    with errors():
        st, fleet = _open(store, coordinator)
        try:
            s = fleet_status(st, SystemClock().now_ms(), fleet())
            ret = st.retention
        finally:
            st.close()
    data = {"pollers": s.members, "shards_per_poller": s.shards_per_owner, "unowned_shards": s.unowned,
            "layouts": s.layouts, "worst": s.worst.to_dict() if s.worst else None,
            "retention_s": ret.jobs_s, "dead_retention_s": ret.dead_s,
            "poller_dcs": s.dcs, "home_weights": s.weights, "foreign_shards": s.foreign}

    def human() -> None:
        from rich.console import Console
        from rich.table import Table

        console = Console()
        pollers = "unknown (no ZooKeeper coordinator)" if s.members is None else str(len(s.members))
        console.print(f"[bold]pollers[/]: {pollers}")
        table = Table(title="shards per poller")
        table.add_column("poller")
        table.add_column("dc")
        table.add_column("shards", justify="right")
        table.add_column("which")
        for owner, shards in s.shards_per_owner.items():
            table.add_row(cell(owner), cell(s.dcs.get(owner) or "-"), str(len(shards)), shard_ranges(shards))
        if s.unowned:
            table.add_row("[red]nobody[/]", "", str(len(s.unowned)), shard_ranges(s.unowned))
        console.print(table)
        if s.weights:
            from ..domain.home import format_weights

            console.print(f"home DCs: {format_weights(s.weights)}")
        if s.foreign:
            console.print(f"[yellow]served by a foreign DC[/]: {len(s.foreign)} shards "
                          f"({shard_ranges(s.foreign)})")
        for lay in s.layouts:
            console.print(f"layout: from {cell(lay['from'])} on, S = {lay['shard_count']}")
        if s.worst:
            console.print(f"worst lag: shard {s.worst.shard}, {_fmt_lag(s.worst.lag_s)}, "
                          f"due backlog {s.worst.backlog}")
        console.print(f"retention: jobs {format_duration(ret.jobs_s)} after they fire, are cancelled "
                      f"or die; dead letters {format_duration(ret.dead_s)}")

    emit(data, as_json, human)


@app.command()
def inspect(
    bucket: Annotated[str, typer.Argument(help="Bucket start in epoch seconds, or any ISO 8601 time in it.")],
    shard: Annotated[int | None, typer.Option(help="Only this shard.")] = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The rows of one bucket, fired ones included."""
    from ..domain.keys import from_ms
    from ..observe.lag import bucket_rows

    with errors():
        st, _ = _open(store, "local")
        try:
            width = st.meta().bucket_width_s
            b = parse_bucket(bucket, width)
            count = st.layouts().read_count(b)
            if shard is not None and not 0 <= shard < count:
                raise InvalidInput(f"--shard {shard} is out of range: bucket {b} has shards 0-{count - 1}")
            rows = bucket_rows(st, b, shard)
        finally:
            st.close()
    data = {"bucket": b, "from": from_ms(b * 1000).isoformat(), "shard_count": count,
            "rows": [{"job_id": j.job_id, "shard": j.shard, "kind": j.kind, "due_at": j.due_at.isoformat(),
                      "fire_at": j.fire_at.isoformat(), "status": str(j.status), "attempts": j.attempts,
                      "fired_at": j.fired_at.isoformat() if j.fired_at else None} for j in rows]}

    def human() -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"bucket {data['from']} ({len(rows)} rows, S = {count})")
        for col in ("shard", "job_id", "kind", "due_at", "status", "fired_at"):
            table.add_column(col)
        for r in data["rows"]:
            table.add_row(str(r["shard"]), cell(r["job_id"]), cell(r["kind"]), r["due_at"], r["status"],
                          r["fired_at"] or "")
        Console().print(table)

    emit(data, as_json, human)


@app.command()
def forecast(
    hours: Annotated[float, typer.Option(help="How far ahead to count.")] = 1.0,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Jobs due per minute and per shard ahead, counted from the buckets."""
    from ..domain.clock import SystemClock
    from ..domain.keys import from_ms
    from ..observe.lag import forecast as run_forecast

    with errors():
        if not 0 < hours <= 24 * 31:
            raise InvalidInput(f"--hours {hours} is out of range: give a number of hours in (0, 744]")
        st, _ = _open(store, "local")
        try:
            if as_json:
                fc = run_forecast(st, SystemClock().now_ms(), hours)
            else:
                fc = _forecast_with_bar(st, hours, run_forecast)
        finally:
            st.close()
    per_bucket: list[dict[str, Any]] = [{"bucket": b, "from": from_ms(b * 1000).isoformat(), "jobs": n}
                  for b, n in sorted(fc.per_bucket.items())]
    data = {"bucket_width_s": fc.bucket_width_s, "total": fc.total, "per_bucket": per_bucket,
            "per_shard": {str(s): n for s, n in sorted(fc.per_shard.items())},
            "cells": [{"bucket": b, "shard": s, "jobs": n} for (b, s), n in sorted(fc.cells.items())]}

    def human() -> None:
        from rich.console import Console
        from rich.table import Table

        peak = max(fc.per_bucket.values(), default=0) or 1
        table = Table(title=f"{fc.total} jobs due in the next {hours:g} h")
        table.add_column("bucket")
        table.add_column("jobs", justify="right")
        table.add_column("")
        for row in per_bucket:
            if row["jobs"]:
                table.add_row(row["from"], str(row["jobs"]), "#" * max(1, round(30 * row["jobs"] / peak)))
        console = Console()
        console.print(table)
        busiest = sorted(fc.per_shard.items(), key=lambda kv: -kv[1])[:8]
        console.print("busiest shards: " + ", ".join(f"{s}: {n}" for s, n in busiest))

    emit(data, as_json, human)


def _forecast_with_bar(st: Any, hours: float, run_forecast: Any) -> Any:
    from rich.progress import Progress

    from ..domain.clock import SystemClock

    with Progress(transient=True) as bar:
        task = bar.add_task("counting partitions", total=None)
        return run_forecast(st, SystemClock().now_ms(), hours,
                            progress=lambda done, total: bar.update(task, completed=done, total=total))


@app.command()
def exporter(
    address: Annotated[str, typer.Option(help="Serve /metrics on HOST:PORT.")] = "127.0.0.1:9464",
    interval: Annotated[str, typer.Option(metavar=DURATION, help="Time between reads of the store.")
                        ] = "15s",
    audit_interval: Annotated[str | None, typer.Option(
        metavar=DURATION,
        help="Audit the last closed hour this often and export "
             "scheduler_audit_violations (default: off; 10m is a good value).")] = None,
    store: StoreOpt = None,
    coordinator: CoordOpt = None,
) -> None:
    """Serve per-shard lag and due backlog read from the store, until SIGTERM or SIGINT.

    It needs no poller: when every poller is down, lag keeps growing here."""
    import contextlib
    import signal
    import threading

    from .. import logs
    from ..domain.clock import SystemClock
    from ..observe.exporter import LagExporter
    from ..observe.metrics import start_server

    logs.setup(json_output=False)
    stop = threading.Event()
    with errors(), contextlib.ExitStack() as opened:
        # What is opened here is closed on every way out, in reverse order, as in
        # runtime/runner.py: a start-up step that fails (the metrics address taken, the
        # store or ZooKeeper unreachable, signals refused off the main thread) leaves
        # no store session, exporter thread or listening socket behind. The fleet view
        # holds no ZooKeeper session between reads: each read opens and closes its own.
        interval_s = duration(interval, "--interval", allow_zero=False)
        audit_s = None if audit_interval is None else duration(audit_interval, "--audit-interval")
        if audit_s is not None and audit_s < 60:
            raise InvalidInput("--audit-interval must be at least 60 seconds: each audit reads a whole hour")
        st, fleet = _open(store, coordinator)
        opened.callback(st.close)
        exp = LagExporter(st, SystemClock(), fleet, interval_s=interval_s, audit_interval_s=audit_s)
        exp.refresh()  # fail at start, with a clear message, rather than serve nothing
        server = start_server(exp.registry, address)
        opened.callback(server.close)
        opened.callback(exp.stop)  # a no-op before its start
        for sig in (signal.SIGTERM, signal.SIGINT):
            opened.callback(signal.signal, sig, signal.signal(sig, lambda *_: stop.set()))
        exp.start()
        typer.echo(f"exporter: serving lag of {st.url} on http://{server.address}/metrics", err=True)
        stop.wait()


@app.command()
def audit(
    from_: Annotated[str | None, typer.Option(
        "--from", metavar=TIME, help="ISO time (default: the start of the last closed hour).")] = None,
    to: Annotated[str | None, typer.Option(
        metavar=TIME,
        help="ISO time (default: now with --from, else the end of the last closed hour).")] = None,
    lookups: Annotated[bool, typer.Option(
        "--lookups", help="Also read the whole lookup table for rows pointing into the range at "
                          "no bucket row (costs a read of every job stored).")] = False,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Count every job of each bucket and shard in the range by outcome, and flag lost
    ones (pending rows behind their shard's checkpoint). Exit 2 when any is found."""
    import sys

    from rich.progress import Progress

    from ..domain.clock import SystemClock
    from ..domain.keys import to_ms
    from ..observe.audit import audit as run_audit
    from ..observe.audit import last_closed_hour
    from .common import parse_at

    with errors():
        now = SystemClock().now_ms()
        start, end = last_closed_hour(now)
        start = to_ms(parse_at(from_)) if from_ else start
        end = to_ms(parse_at(to)) if to else (now if from_ else end)
        if end < start:
            raise InvalidInput("--to is before --from; give a range forwards in time")
        st, _ = _open(store, None)
        try:
            with Progress(disable=as_json or not sys.stderr.isatty(), transient=True) as bar:
                task = bar.add_task("auditing partitions", total=None)
                report = run_audit(st, start, end, lambda done, total: bar.update(task, completed=done,
                                                                                  total=total),
                                   lookups=lookups)
        finally:
            st.close()
    data = report.as_dict()

    def human() -> None:
        t = data["totals"]
        typer.echo(f"{data['partitions']} partitions: " + ", ".join(f"{k} {v}" for k, v in t.items()))
        for v in data["violations"]:
            typer.echo(f"VIOLATION bucket {v['bucket']} shard {v['shard']} job {plain(repr(v['job_id']))}: "
                       f"{plain(v['reason'])}")

    emit(data, as_json, human)
    if report.violations:
        raise typer.Exit(2)
