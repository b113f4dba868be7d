"""The ``scheduler`` command: parse, call the library, print. Nothing else lives here.

Every view takes ``--json``. Exit codes and what reaches stdout and stderr: the table in
docs/CLI.md, kept for every command by ``common.ContractGroup``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import InvalidInput
from ..fleet.coord import DEFAULT_SESSION_TIMEOUT_S
from ..settings import Settings
from . import admin, api, console, flow, ops, recurring  # noqa: F401  (they register their commands)
from .common import (
    DURATION,
    TIME,
    JsonOpt,
    StoreOpt,
    app,
    cell,
    check_coordinator,
    client_for,
    duration,
    emit,
    errors,
    fail,
    given_options,
    job_table,
    parse_at,
    plain,
    store_for,
)

# --- jobs -------------------------------------------------------------------------------


@app.command()
def schedule(
    job_id: Annotated[str, typer.Option("--id", help="Job id, unique per job.")],
    at: Annotated[str, typer.Option(metavar=TIME, help="Due time, ISO 8601 with an offset.")],
    kind: Annotated[str, typer.Option(help="Job kind, routes it to a handler.")],
    payload: Annotated[str | None, typer.Option(help="JSON payload.")] = None,
    jitter: Annotated[str, typer.Option(
        metavar=DURATION, help="Fire any time up to this long after due (0.5, 30s, 5m).")] = "0",
    priority: Annotated[str, typer.Option(
        metavar="0-9", help="9 starts first when more jobs are due than can start.")] = "5",
    key: Annotated[str | None, typer.Option(
        metavar="KEY", help="A customer, an account...: per-key limits and turns; the job is "
                            "placed in its key's shard.")] = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Schedule one job (idempotent by id)."""
    from ..domain.flow import check_key, parse_priority
    from ..domain.jobspec import loads

    with errors():
        due = parse_at(at)
        jitter_s = duration(jitter, "--jitter")
        level = parse_priority(priority)
        key = None if key is None else check_key(key)
        value = None if payload is None else loads(payload, "--payload")
        client = client_for(store)
        try:
            job = client.schedule(job_id, due, kind, value, jitter_s=jitter_s, priority=level,
                                  key=key).to_dict()
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
    """Cancel a pending job. No pending job of that id (unknown, fired, cancelled or
    dead) is an error: one line on stderr, exit 1."""
    with errors():
        client = client_for(store)
        try:
            done = client.cancel(job_id)
        finally:
            client.close()
    if not done:
        fail(f"no pending job {job_id!r} to cancel (it is unknown, already fired, cancelled or dead: "
             f"see `scheduler get {job_id}`)")
    emit({"job_id": job_id, "cancelled": done}, as_json, lambda: typer.echo(f"cancelled {plain(job_id)}"))


@app.command()
def reschedule(job_id: str, at: Annotated[str, typer.Option(metavar=TIME, help="New due time, ISO 8601.")],
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
    """Bulk-load jobs from JSON lines (fields as `schedule`: id, at, kind, payload, jitter
    in seconds, priority 0-9, key). The whole file is checked first: one bad line or job
    writes nothing."""
    from rich.progress import Progress

    from ..domain.jobspec import records_from_lines

    with errors():
        records = records_from_lines(_read_lines(file), str(file))
        client = client_for(store)
        try:
            with Progress(disable=as_json or not sys.stderr.isatty(), transient=False) as bar:
                task = bar.add_task("scheduling", total=len(records))
                jobs = _load_with_retries(client, records, lambda n: bar.advance(task, n))
        finally:
            client.close()
    noun = "job" if len(jobs) == 1 else "jobs"
    emit({"loaded": len(jobs)}, as_json, lambda: typer.echo(f"scheduled {len(jobs)} {noun}"))


LOAD_RETRIES = 5


def _load_with_retries(client: Any, records: list[Any], progress: Callable[[int], None]) -> list[Any]:
    """``schedule_many``, retried on a timeout or an unreachable store (a node restarting):
    the same call again is safe, and the client reuses the placements of writes that may
    have landed. One line per retry; the last error propagates."""
    import time

    from ..errors import StoreUnavailable, WriteTimeout

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


def _read_lines(path: Path) -> list[str]:
    """The lines of ``path`` (``-``: stdin), UTF-8; ``InvalidInput`` when it cannot be
    read or decoded."""
    try:
        data = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
        return split_lines(data.decode("utf-8"))
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None


def split_lines(text: str) -> list[str]:
    """``text`` split at each "\\n" (a "\\r" before it dropped), as JSON lines are: not
    ``str.splitlines``, which also splits at U+2028, U+2029 and U+0085, characters a JSON
    string may hold unescaped (``json.dumps(..., ensure_ascii=False)`` writes them)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


# --- pollers ----------------------------------------------------------------------------


@app.command()
def run(
    ctx: typer.Context,
    handler: Annotated[str | None, typer.Option(help="module:function receiving every job.")] = None,
    app_: Annotated[str | None, typer.Option("--app", help="module:app, a scheduler.App.")] = None,
    shards: Annotated[str | None, typer.Option(
        help="Own exactly these shards, e.g. 0-15, without coordination.")] = None,
    coordinator: Annotated[str | None, typer.Option(
        help="local or zookeeper://h1:2181,h2:2181/root (default $SCHEDULER_COORDINATOR).")] = None,
    session_timeout: Annotated[str, typer.Option(metavar=DURATION, help="ZooKeeper session timeout.")
                               ] = f"{DEFAULT_SESSION_TIMEOUT_S:g}s",
    store_failure_release: Annotated[str, typer.Option(
        metavar=DURATION,
        help="In a fleet: after this long of failing store calls, release every shard "
             "to the other pollers until the store answers (0: never).")] = "30s",
    concurrency: Annotated[int, typer.Option(
        help="Handlers running at once: threads, or coroutines for async handlers.")] = 16,
    handler_timeout: Annotated[str, typer.Option(
        metavar=DURATION,
        help="How long a handler call may run before it counts as failed (a kind's own "
             "timeout_s wins; 0: no limit).")] = "10m",
    poll_interval: Annotated[str, typer.Option(metavar=DURATION, help="Time between polls.")] = "1s",
    max_rate: Annotated[float | None, typer.Option(help="Jobs/s this poller dispatches to handlers.")] = None,
    max_shard_rate: Annotated[float | None, typer.Option(help="Jobs/s dispatched per shard.")] = None,
    metrics_address: Annotated[str | None, typer.Option(
        help="Serve /metrics on HOST:PORT, or off (default $SCHEDULER_METRICS_ADDRESS, "
             "else 127.0.0.1:9460).")] = None,
    name: Annotated[str | None, typer.Option(help="Poller name (default: random).")] = None,
    log_json: Annotated[bool, typer.Option("--log-json", help="JSON log lines.")] = False,
    processes: Annotated[int, typer.Option(
        help="Run this many pollers, each its own process and fleet member, under one "
             "supervisor that restarts them; metrics on the base port + index (0: one per core).")] = 1,
    dc: Annotated[str | None, typer.Option(
        help="Cassandra DC of this poller: its nodes only, LOCAL_QUORUM, LOCAL_SERIAL fencing "
             "(default $SCHEDULER_DC, else the store URL's local_dc); also the DC it "
             "advertises to the fleet for `shards home`.")] = None,
    dc_failover_delay: Annotated[str, typer.Option(
        metavar=DURATION,
        help="With a home-DC rule (`shards home`): how long a DC may have no live poller "
             "before pollers of the other DCs take its shards, and have one again before "
             "they hand them back.")] = "30s",
    store: StoreOpt = None,
) -> None:
    """Run a poller until SIGTERM or SIGINT, then shut down gracefully (exit 0).

    Exits 3 when its ZooKeeper session expired, 4 when the poller failed (a thread
    crashed, or too many handlers hung): run it under a supervisor. With --processes N
    (N > 1) it is that supervisor: exit 1 when a member refused its settings, 5 when
    members keep crashing."""
    import os

    from .. import logs
    from ..domain.layout import parse_shard_spec
    from ..domain.topology import check_dc
    from ..poller import PollerConfig
    from ..runtime.handlers import load_app
    from ..runtime.runner import run_poller
    from ..runtime.supervisor import processes_default, supervise

    logs.setup(json_output=log_json)
    sys.path.insert(0, os.getcwd())  # handlers are usually modules of the current project
    with errors():
        if dc is not None:
            check_dc(dc, "--dc")
        if concurrency < 1:
            raise InvalidInput(f"--concurrency {concurrency} must be at least 1")
        for flag, rate in (("--max-rate", max_rate), ("--max-shard-rate", max_shard_rate)):
            if rate is not None and not 0 < rate < math.inf:  # nan fails both comparisons
                raise InvalidInput(f"{flag} {rate} must be a number of jobs per second > 0 "
                                   "(leave it out for no limit)")
        interval_s = duration(poll_interval, "--poll-interval", allow_zero=False)
        session_s = duration(session_timeout, "--session-timeout", allow_zero=False)
        release_s = duration(store_failure_release, "--store-failure-release")
        failover_s = duration(dc_failover_delay, "--dc-failover-delay")
        timeout_s = duration(handler_timeout, "--handler-timeout")
        fixed = parse_shard_spec(shards) if shards else None
        if not shards:
            coordinator = check_coordinator(coordinator)
        count = processes_default(processes)
        if count > 1:
            if shards:
                raise InvalidInput("--processes needs a fleet: drop --shards (fixed shards "
                                   "cannot be split between processes)")
            load_app(handler, app_)  # a handler that does not import fails here, once
            settings = Settings.from_env()
            if not (coordinator or "local").lower().startswith("zookeeper:"):
                # Local coordination lives inside one process: N of them would each own
                # every shard.
                raise InvalidInput("--processes needs a ZooKeeper fleet: pass --coordinator "
                                   "zookeeper://HOST:PORT/ROOT (or set SCHEDULER_COORDINATOR)")
            # Each member gets this command's options but those the supervisor sets per
            # member; rebuilt from what was parsed: sys.argv may hold other words "run".
            argv = given_options(ctx, leave_out=("processes", "metrics_address", "name"))
            raise typer.Exit(supervise(count, argv, metrics_address or settings.metrics_address,
                                       settings.notify_address or "off", name,
                                       lambda line: typer.echo(line, err=True)))
        config = PollerConfig(poll_interval_s=interval_s, concurrency=concurrency,
                              max_rate=max_rate, max_shard_rate=max_shard_rate,
                              handler_timeout_s=timeout_s or None,
                              notify_address=Settings.from_env().notify_address)
        the_app = load_app(handler, app_)
        st = store_for(store, dc=dc)
        try:
            code = run_poller(the_app, store=st, config=config, name=name, shards=fixed,
                              coordinator=coordinator, metrics_address=metrics_address,
                              session_timeout_s=session_s, store_failure_release_s=release_s,
                              dc_failover_s=failover_s, dc=dc,
                              announce=lambda line: typer.echo(line, err=True))
        finally:
            st.close()
    if code:
        raise typer.Exit(code)


@app.command()
def demo(
    jobs: Annotated[int, typer.Option(help="Jobs to schedule.")] = 2000,
    pollers: Annotated[int, typer.Option(help="Pollers to run in this process.")] = 2,
    seconds: Annotated[str, typer.Option(metavar=DURATION, help="Spread the due times over this long.")
                       ] = "20s",
    store: Annotated[str | None, typer.Option(help="Store URL (default: temporary embedded).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Schedule jobs, fire them with in-process pollers, and check nothing was lost or early.

    At most 1,000,000 jobs, 64 pollers and 1 day. SIGTERM stops it as Ctrl-C does
    (the temporary store is removed), with exit 143."""
    from ..runtime.demo import EXIT_TERMINATED, Terminated, check_demo, run_demo, sigterm_stops

    with errors():
        spread_s = duration(seconds, "--seconds", allow_zero=False)
        check_demo(jobs, pollers, spread_s)
        live = not as_json and sys.stdout.isatty()
        try:
            with sigterm_stops():
                if live:
                    summary = _demo_live(jobs, pollers, spread_s, store)
                else:
                    summary = run_demo(jobs, pollers, spread_s, store)
        except Terminated:
            raise typer.Exit(EXIT_TERMINATED) from None
    data = summary.to_dict()

    def human() -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="demo summary", show_header=False)
        for key, value in data.items():
            table.add_row(cell(key), cell(value))
        Console().print(table)

    emit(data, as_json, human)
    if summary.lost or summary.early:
        fail(f"the demo found {summary.lost} lost and {summary.early} early jobs (the summary on stdout "
             "has the numbers; report it)")


def _demo_live(jobs: int, pollers: int, seconds: float, store: str | None) -> Any:
    from rich.console import Group
    from rich.live import Live
    from rich.progress import BarColumn, Progress, TextColumn
    from rich.table import Table

    from ..runtime.demo import run_demo

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
