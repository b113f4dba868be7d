"""The ``scheduler`` command: parse, call the library, print. Nothing else lives here.

Every view takes ``--json``. A ``SchedulerError`` becomes one line on stderr and exit
status 1; usage errors exit 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from . import cli_admin, cli_console, cli_ops, cli_recurring  # noqa: F401  (they register their commands)
from .cli_common import (
    JsonOpt,
    StoreOpt,
    app,
    client_for,
    emit,
    errors,
    job_table,
    parse_at,
    schema_app,
)
from .coord import DEFAULT_SESSION_TIMEOUT_S
from .errors import InvalidInput
from .settings import Settings

# --- schema -----------------------------------------------------------------------------


@schema_app.command("apply")
def schema_apply(
    store: StoreOpt = None,
    shards: Annotated[int, typer.Option(help="Shard count S of a new keyspace.")] = 16,
    bucket_width: Annotated[int, typer.Option(help="Bucket width in seconds, fixed at creation.")] = 60,
    replication: Annotated[str, typer.Option(help="simple:RF or nts:DC=RF[,DC=RF].")] = "simple:1",
    retention: Annotated[str | None, typer.Option(
        help="Keep a job's rows this long after it fires, is cancelled or dies (90s, 12h, 7d). "
             "Default 7d for a new keyspace; given for an existing one, changes it.")] = None,
    dead_retention: Annotated[str | None, typer.Option(
        help="Keep dead letters this long (default 30d); changes an existing keyspace's.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create the keyspace and tables, or upgrade them; safe to run again."""
    from .clock import SystemClock
    from .layout import check_shard_count
    from .retention import format_duration, parse_duration
    from .store import SchemaOptions, open_store

    with errors():
        check_shard_count(shards)
        if not 1 <= bucket_width <= 3600 or 3600 % bucket_width:
            raise InvalidInput(f"--bucket-width {bucket_width} must divide 3600 (e.g. 1, 10, 60)")
        keep = None if retention is None else parse_duration(retention, "--retention")
        keep_dead = None if dead_retention is None else parse_duration(dead_retention, "--dead-retention")
        st = open_store(Settings.from_env().require_store(store))
        try:
            res = st.apply_schema(SchemaOptions(shard_count=shards, bucket_width_s=bucket_width,
                                                replication=replication, retention_s=keep,
                                                dead_retention_s=keep_dead), SystemClock().now_ms())
        finally:
            st.close()
    meta = res.meta
    data = {"store": st.url, "from_version": res.from_version, "version": res.to_version,
            "created": res.created, "bucket_width_s": meta.bucket_width_s,
            "origin_bucket": meta.origin_bucket, "retention_s": meta.retention_s,
            "dead_retention_s": meta.dead_retention_s, "retention_changed": res.retention_was is not None}
    if res.created:
        what = "created"
    elif res.from_version < res.to_version:
        what = f"upgraded from v{res.from_version}"
    else:
        what = "already current"
    lines = [f"schema v{res.to_version} on {st.url} ({what}); retention {format_duration(meta.retention_s)}, "
             f"dead letters {format_duration(meta.dead_retention_s)}"]
    if res.retention_was is not None:
        was = res.retention_was
        lines.append(
            f"retention changed (was {format_duration(was.jobs_s)}, "
            f"dead letters {format_duration(was.dead_s)}): "
            "it applies to rows written from now on by processes started after this change (restart "
            "producers and pollers); rows already written keep the expiry they were written with")
    emit(data, as_json, lambda: typer.echo("\n".join(lines)))


# --- jobs -------------------------------------------------------------------------------


@app.command()
def schedule(
    job_id: Annotated[str, typer.Option("--id", help="Job id, unique per job.")],
    at: Annotated[str, typer.Option(help="Due time, ISO 8601 with an offset.")],
    kind: Annotated[str, typer.Option(help="Job kind, routes it to a handler.")],
    payload: Annotated[str | None, typer.Option(help="JSON payload.")] = None,
    jitter: Annotated[float, typer.Option(help="Fire any time up to this many seconds after due.")] = 0.0,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Schedule one job (idempotent by id)."""
    with errors():
        due = parse_at(at)
        value = None
        if payload is not None:
            try:
                value = json.loads(payload)
            except ValueError as exc:
                raise InvalidInput(f"--payload is not valid JSON: {exc}") from None
        client = client_for(store)
        try:
            job = client.schedule(job_id, due, kind, value, jitter_s=jitter).to_dict()
        finally:
            client.close()
    emit(job, as_json, lambda: job_table(job))


@app.command()
def get(job_id: str, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Show one job: status, payload, attempts, last error, fired time, and where it came
    from (a re-fire, a schedule, replays of its dead letter)."""
    with errors():
        client = client_for(store)
        try:
            view = client.describe(job_id)
        finally:
            client.close()
    emit(view.to_dict(), as_json, lambda: typer.echo("\n".join(view.lines())))


@app.command()
def cancel(job_id: str, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Cancel a pending job. Exit status 1 when there was no pending job to cancel."""
    with errors():
        client = client_for(store)
        try:
            done = client.cancel(job_id)
        finally:
            client.close()
    emit({"job_id": job_id, "cancelled": done}, as_json,
         lambda: typer.echo(f"cancelled {job_id}" if done else f"{job_id}: no pending job to cancel"))
    if not done:
        raise typer.Exit(1)


@app.command()
def reschedule(job_id: str, at: Annotated[str, typer.Option(help="New due time, ISO 8601.")],
               store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Move a job to a new due time."""
    with errors():
        due = parse_at(at)
        client = client_for(store)
        try:
            job = client.reschedule(job_id, due).to_dict()
        finally:
            client.close()
    emit(job, as_json, lambda: job_table(job))


@app.command()
def load(file: Annotated[Path, typer.Argument(help="JSON lines, one job per line; - for stdin.")],
         store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Bulk-load jobs from JSON lines (fields as `schedule`: id, at, kind, payload, jitter)."""
    from rich.progress import Progress

    with errors():
        lines = (sys.stdin if str(file) == "-" else _open_lines(file))
        records = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except ValueError as exc:
                raise InvalidInput(f"{file}:{n}: not valid JSON ({exc})") from None
        client = client_for(store)
        try:
            with Progress(disable=as_json or not sys.stderr.isatty(), transient=False) as bar:
                task = bar.add_task("scheduling", total=len(records))
                jobs = _load_with_retries(client, records, lambda n: bar.advance(task, n))
        finally:
            client.close()
    emit({"loaded": len(jobs)}, as_json, lambda: typer.echo(f"scheduled {len(jobs)} jobs"))


LOAD_RETRIES = 5


def _load_with_retries(client: Any, records: list[Any], progress: Callable[[int], None]) -> list[Any]:
    """``schedule_many``, retried on a timeout or an unreachable store (a node restarting):
    the same call again is safe, and the client reuses the placements of writes that may
    have landed. One line per retry; the last error propagates."""
    import time

    from .errors import StoreUnavailable, WriteTimeout

    for attempt in range(1, LOAD_RETRIES + 1):
        try:
            return list(client.schedule_many(records, progress=progress))
        except (WriteTimeout, StoreUnavailable) as exc:
            if attempt == LOAD_RETRIES:
                raise
            delay = 2 ** (attempt - 1)
            typer.echo(f"load: {exc}; retrying the same load in {delay} s "
                       f"({attempt}/{LOAD_RETRIES - 1})", err=True)
            time.sleep(delay)
    raise AssertionError("unreachable")


def _open_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}") from None


# --- pollers ----------------------------------------------------------------------------


@app.command()
def run(
    handler: Annotated[str | None, typer.Option(help="module:function receiving every job.")] = None,
    app_: Annotated[str | None, typer.Option("--app", help="module:app, a scheduler.App.")] = None,
    shards: Annotated[str | None, typer.Option(
        help="Own exactly these shards, e.g. 0-15, without coordination.")] = None,
    coordinator: Annotated[str | None, typer.Option(
        help="local or zookeeper://h1:2181,h2:2181/root (default $SCHEDULER_COORDINATOR).")] = None,
    session_timeout: Annotated[float, typer.Option(help="ZooKeeper session timeout, seconds.")
                               ] = DEFAULT_SESSION_TIMEOUT_S,
    store_failure_release: Annotated[float, typer.Option(
        help="In a fleet: after this many seconds of failing store calls, release every shard "
             "to the other pollers until the store answers (0: never).")] = 30.0,
    concurrency: Annotated[int, typer.Option(
        help="Handlers running at once: threads, or coroutines for async handlers.")] = 16,
    handler_timeout: Annotated[float, typer.Option(
        help="Seconds a handler call may run before it counts as failed (a kind's own "
             "timeout_s wins; 0: no limit).")] = 600.0,
    poll_interval: Annotated[float, typer.Option(help="Seconds between polls.")] = 1.0,
    max_rate: Annotated[float | None, typer.Option(help="Jobs/s this poller releases.")] = None,
    max_shard_rate: Annotated[float | None, typer.Option(help="Jobs/s released per shard.")] = None,
    metrics_address: Annotated[str | None, typer.Option(
        help="Serve /metrics on HOST:PORT, or off (default $SCHEDULER_METRICS_ADDRESS, "
             "else 127.0.0.1:9460).")] = None,
    name: Annotated[str | None, typer.Option(help="Poller name (default: random).")] = None,
    log_json: Annotated[bool, typer.Option("--log-json", help="JSON log lines.")] = False,
    processes: Annotated[int, typer.Option(
        help="Run this many pollers, each its own process and fleet member, under one "
             "supervisor that restarts them; metrics on the base port + index (0: one per core).")] = 1,
    store: StoreOpt = None,
) -> None:
    """Run a poller until SIGTERM or SIGINT, then shut down gracefully (exit 0).

    Exits 3 when its ZooKeeper session expired, 4 when the poller failed (a thread
    crashed, or too many handlers hung): run it under a supervisor. With --processes N
    (N > 1) it is that supervisor: exit 1 when a member refused its settings, 5 when
    members keep crashing."""
    import os

    from . import logs
    from .dispatch import load_app
    from .layout import parse_shard_spec
    from .poller import PollerConfig
    from .runner import run_poller
    from .supervisor import processes_default, supervise

    logs.setup(json_output=log_json)
    sys.path.insert(0, os.getcwd())  # handlers are usually modules of the current project
    with errors():
        if concurrency < 1 or poll_interval <= 0 or store_failure_release < 0 or handler_timeout < 0:
            raise InvalidInput("--concurrency must be >= 1, --poll-interval > 0, and "
                               "--store-failure-release and --handler-timeout >= 0")
        count = processes_default(processes)
        if count > 1:
            if shards:
                raise InvalidInput("--processes needs a fleet: drop --shards (fixed shards "
                                   "cannot be split between processes)")
            load_app(handler, app_)  # a handler that does not import fails here, once
            settings = Settings.from_env()
            if not (coordinator or settings.coordinator or "local").startswith("zookeeper:"):
                # Local coordination lives inside one process: N of them would each own
                # every shard.
                raise InvalidInput("--processes needs a ZooKeeper fleet: pass --coordinator "
                                   "zookeeper://HOST:PORT/ROOT (or set SCHEDULER_COORDINATOR)")
            argv = sys.argv[sys.argv.index("run") + 1:]
            raise typer.Exit(supervise(count, argv, metrics_address or settings.metrics_address,
                                       settings.notify_address or "off", name,
                                       lambda line: typer.echo(line, err=True)))
        config = PollerConfig(poll_interval_s=poll_interval, concurrency=concurrency,
                              max_rate=max_rate, max_shard_rate=max_shard_rate,
                              handler_timeout_s=handler_timeout or None,
                              notify_address=Settings.from_env().notify_address)
        code = run_poller(load_app(handler, app_), store=store, config=config, name=name,
                          shards=parse_shard_spec(shards) if shards else None,
                          coordinator=coordinator, metrics_address=metrics_address,
                          session_timeout_s=session_timeout,
                          store_failure_release_s=store_failure_release,
                          announce=lambda line: typer.echo(line, err=True))
    if code:
        raise typer.Exit(code)


@app.command()
def demo(
    jobs: Annotated[int, typer.Option(help="Jobs to schedule.")] = 2000,
    pollers: Annotated[int, typer.Option(help="Pollers to run in this process.")] = 2,
    seconds: Annotated[float, typer.Option(help="Spread the due times over this many seconds.")] = 20.0,
    store: Annotated[str | None, typer.Option(help="Store URL (default: temporary embedded).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Schedule jobs, fire them with in-process pollers, and check nothing was lost or early."""
    from .demo import run_demo

    with errors():
        if jobs < 1 or pollers < 1 or seconds <= 0:
            raise InvalidInput("--jobs and --pollers must be >= 1 and --seconds > 0")
        live = not as_json and sys.stdout.isatty()
        if live:
            summary = _demo_live(jobs, pollers, seconds, store)
        else:
            summary = run_demo(jobs, pollers, seconds, store)
    data = summary.to_dict()

    def human() -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="demo summary", show_header=False)
        for key, value in data.items():
            table.add_row(key, str(value))
        Console().print(table)

    emit(data, as_json, human)
    if summary.lost or summary.early:
        raise typer.Exit(1)


def _demo_live(jobs: int, pollers: int, seconds: float, store: str | None) -> Any:
    from rich.console import Group
    from rich.live import Live
    from rich.progress import BarColumn, Progress, TextColumn
    from rich.table import Table

    from .demo import run_demo

    bar = Progress(TextColumn("fired"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TextColumn("{task.fields[lat]}"))
    task = bar.add_task("fired", total=jobs, lat="")
    holder: dict[str, Any] = {"table": Table()}

    def tick(state: dict[str, Any]) -> None:
        bar.update(task, completed=state["fired"],
                   lat=f"lateness p50 {state['lateness_p50_ms']:.0f} ms, "
                       f"p99 {state['lateness_p99_ms']:.0f} ms, {state['elapsed_s']:.0f} s")
        table = Table(title=f"{pollers} pollers, {state['shards']} shards")
        table.add_column("shard")
        table.add_column("fired", justify="right")
        table.add_column("pending", justify="right")
        for shard in range(state["shards"]):
            want = state["expected_per_shard"].get(shard, 0)
            got = state["per_shard"].get(shard, 0)
            table.add_row(str(shard), str(got), str(max(0, want - got)))
        holder["table"] = table
        live.update(Group(holder["table"], bar))

    with Live(Group(holder["table"], bar), refresh_per_second=4, transient=False) as live:
        return run_demo(jobs, pollers, seconds, store, on_tick=tick)


def main() -> None:
    app()
