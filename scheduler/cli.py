"""The ``scheduler`` command: parse, call the library, print. Nothing else lives here.

Every view takes ``--json``. A ``SchedulerError`` becomes one line on stderr and exit
status 1; usage errors exit 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from .errors import InvalidInput, SchedulerError
from .settings import Settings

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="A durable scheduler for future one-shot jobs.")
schema_app = typer.Typer(no_args_is_help=True, help="Create or upgrade the store's schema.")
shards_app = typer.Typer(no_args_is_help=True, help="Show or change the shard layouts.")
dead_app = typer.Typer(no_args_is_help=True, help="List or replay dead-lettered jobs.")
app.add_typer(schema_app, name="schema")
app.add_typer(shards_app, name="shards")
app.add_typer(dead_app, name="dead")

StoreOpt = Annotated[str | None, typer.Option("--store", help="Store URL; default $SCHEDULER_STORE.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


@contextmanager
def errors() -> Iterator[None]:
    try:
        yield
    except SchedulerError as exc:
        fail(str(exc))


def emit(data: Any, as_json: bool, human: Callable[[], None] | None = None) -> None:
    if as_json or human is None:
        typer.echo(json.dumps(data, default=str, sort_keys=True))
    else:
        human()


def _client(store: str | None) -> Any:
    from .client import Client

    return Client(store, settings=Settings.from_env())


def _job_table(job: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=False, box=None)
    for key, value in job.items():
        table.add_row(f"[bold]{key}[/]", "" if value is None else str(value))
    Console().print(table)


def _parse_at(text: str) -> Any:
    from .model import parse_time

    return parse_time(text)


# --- schema -----------------------------------------------------------------------------


@schema_app.command("apply")
def schema_apply(
    store: StoreOpt = None,
    shards: Annotated[int, typer.Option(help="Shard count S of a new keyspace.")] = 16,
    bucket_width: Annotated[int, typer.Option(help="Bucket width in seconds, fixed at creation.")] = 60,
    replication: Annotated[str, typer.Option(help="simple:RF or nts:DC=RF[,DC=RF].")] = "simple:1",
    as_json: JsonOpt = False,
) -> None:
    """Create the keyspace and tables, or upgrade them; safe to run again."""
    from .clock import SystemClock
    from .layout import check_shard_count
    from .store import SchemaOptions, open_store

    with errors():
        check_shard_count(shards)
        if not 1 <= bucket_width <= 3600 or 3600 % bucket_width:
            raise InvalidInput(f"--bucket-width {bucket_width} must divide 3600 (e.g. 1, 10, 60)")
        st = open_store(Settings.from_env().require_store(store))
        try:
            res = st.apply_schema(SchemaOptions(shard_count=shards, bucket_width_s=bucket_width,
                                                replication=replication), SystemClock().now_ms())
        finally:
            st.close()
    data = {"store": st.url, "from_version": res.from_version, "version": res.to_version,
            "created": res.created, "bucket_width_s": res.meta.bucket_width_s,
            "origin_bucket": res.meta.origin_bucket}
    if res.created:
        what = "created"
    elif res.from_version < res.to_version:
        what = f"upgraded from v{res.from_version}"
    else:
        what = "already current"
    emit(data, as_json, lambda: typer.echo(f"schema v{res.to_version} on {st.url} ({what})"))


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
        due = _parse_at(at)
        value = None
        if payload is not None:
            try:
                value = json.loads(payload)
            except ValueError as exc:
                raise InvalidInput(f"--payload is not valid JSON: {exc}") from None
        client = _client(store)
        try:
            job = client.schedule(job_id, due, kind, value, jitter_s=jitter).to_dict()
        finally:
            client.close()
    emit(job, as_json, lambda: _job_table(job))


@app.command()
def get(job_id: str, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Show one job with its status and history."""
    with errors():
        client = _client(store)
        try:
            job = client.get(job_id).to_dict()
        finally:
            client.close()
    emit(job, as_json, lambda: _job_table(job))


@app.command()
def cancel(job_id: str, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Cancel a pending job. Exit status 1 when there was no pending job to cancel."""
    with errors():
        client = _client(store)
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
        due = _parse_at(at)
        client = _client(store)
        try:
            job = client.reschedule(job_id, due).to_dict()
        finally:
            client.close()
    emit(job, as_json, lambda: _job_table(job))


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
        client = _client(store)
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


# --- shards -----------------------------------------------------------------------------


@shards_app.command("show")
def shards_show(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """List the layouts: from which bucket on which shard count is in force."""
    from .keys import from_ms

    with errors():
        client = _client(store)
        try:
            lays = client.layouts(fresh=True).items
            width = client.meta.bucket_width_s
        finally:
            client.close()
    rows = [{"from_bucket": lay.from_bucket, "from": from_ms(lay.from_bucket * 1000).isoformat(),
             "shard_count": lay.shard_count,
             "written_until": from_ms(lay.mark_end * 1000).isoformat() if lay.mark_end else None}
            for lay in lays]

    def human() -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"shard layouts ({width}s buckets)")
        for col in ("from", "shard_count", "written_until"):
            table.add_column(col)
        for r in rows:
            table.add_row(r["from"], str(r["shard_count"]), r["written_until"] or "-")
        Console().print(table)

    emit({"bucket_width_s": width, "layouts": rows}, as_json, human)


@shards_app.command("resize")
def shards_resize(
    count: Annotated[int, typer.Option(help="New shard count S.")],
    at: Annotated[str, typer.Option(help="Cutover: a bucket boundary, ISO 8601.")],
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change S from the bucket at --at on; earlier buckets keep their S."""
    from .keys import from_ms

    with errors():
        cutover = _parse_at(at)
        client = _client(store)
        try:
            lay = client.resize(count, cutover)
        finally:
            client.close()
    data = {"from_bucket": lay.from_bucket, "from": from_ms(lay.from_bucket * 1000).isoformat(),
            "shard_count": lay.shard_count}
    emit(data, as_json, lambda: typer.echo(f"from {data['from']} on, S = {count}"))


# --- dead letters -----------------------------------------------------------------------


@dead_app.command("list")
def dead_list(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Jobs whose retries ran out, or whose kind had no handler."""
    from .keys import from_ms

    with errors():
        client = _client(store)
        try:
            dead = client.dead_letters()
        finally:
            client.close()
    rows = [{"job_id": d.job_id, "kind": d.kind, "due_at": from_ms(d.due_ms).isoformat(),
             "attempts": d.attempts, "error": d.error, "died_at": from_ms(d.died_ms).isoformat()}
            for d in dead]

    def human() -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{len(rows)} dead letters")
        for col in ("job_id", "kind", "attempts", "died_at", "error"):
            table.add_column(col)
        for r in rows:
            table.add_row(r["job_id"], r["kind"], str(r["attempts"]), r["died_at"], r["error"] or "")
        Console().print(table)

    emit(rows, as_json, human)


@dead_app.command("replay")
def dead_replay(
    job_ids: Annotated[list[str] | None, typer.Argument(help="Jobs to replay.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Replay every dead letter.")] = False,
    at: Annotated[str | None, typer.Option(help="When to fire them (default: now).")] = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-arm dead jobs with their attempts reset."""
    with errors():
        if bool(job_ids) == all_:
            raise InvalidInput("name the jobs to replay, or pass --all")
        when = _parse_at(at) if at else None
        client = _client(store)
        try:
            jobs = client.replay_dead(None if all_ else job_ids, when)
        finally:
            client.close()
    emit({"replayed": [j.job_id for j in jobs]}, as_json,
         lambda: typer.echo(f"replayed {len(jobs)} jobs"))


# --- pollers ----------------------------------------------------------------------------


@app.command()
def run(
    handler: Annotated[str | None, typer.Option(help="module:function receiving every job.")] = None,
    app_: Annotated[str | None, typer.Option("--app", help="module:app, a scheduler.App.")] = None,
    shards: Annotated[str | None, typer.Option(
        help="Own exactly these shards, e.g. 0-15, without coordination.")] = None,
    coordinator: Annotated[str | None, typer.Option(
        help="local or zookeeper://h1:2181,h2:2181/root (default $SCHEDULER_COORDINATOR).")] = None,
    session_timeout: Annotated[float, typer.Option(help="ZooKeeper session timeout, seconds.")] = 10.0,
    store_failure_release: Annotated[float, typer.Option(
        help="In a fleet: after this many seconds of failing store calls, release every shard "
             "to the other pollers until the store answers (0: never).")] = 30.0,
    concurrency: Annotated[int, typer.Option(help="Handlers running at once.")] = 16,
    poll_interval: Annotated[float, typer.Option(help="Seconds between polls.")] = 1.0,
    max_rate: Annotated[float | None, typer.Option(help="Jobs/s this poller releases.")] = None,
    max_shard_rate: Annotated[float | None, typer.Option(help="Jobs/s released per shard.")] = None,
    metrics_address: Annotated[str | None, typer.Option(
        help="Serve /metrics on HOST:PORT, or off (default $SCHEDULER_METRICS_ADDRESS, "
             "else 127.0.0.1:9460).")] = None,
    name: Annotated[str | None, typer.Option(help="Poller name (default: random).")] = None,
    log_json: Annotated[bool, typer.Option("--log-json", help="JSON log lines.")] = False,
    store: StoreOpt = None,
) -> None:
    """Run a poller until SIGTERM or SIGINT, then shut down gracefully (exit 0).

    Exits 3 when its ZooKeeper session expired (run it under a supervisor)."""
    import os
    import signal
    import threading

    from . import logs
    from .coord import open_coordinator
    from .dispatch import load_app
    from .fleet import Fleet
    from .layout import parse_shard_spec
    from .metrics import PollerMetrics, serve
    from .poller import Poller, PollerConfig
    from .store import open_store

    logs.setup(json_output=log_json)
    sys.path.insert(0, os.getcwd())  # handlers are usually modules of the current project
    with errors():
        if concurrency < 1 or poll_interval <= 0 or store_failure_release < 0:
            raise InvalidInput("--concurrency must be >= 1, --poll-interval > 0 and "
                               "--store-failure-release >= 0")
        the_app = load_app(handler, app_)
        settings = Settings.from_env()
        st = open_store(settings.require_store(store))
        owned = parse_shard_spec(shards) if shards else None
        coord = None if owned is not None else open_coordinator(
            coordinator or settings.coordinator, session_timeout_s=session_timeout)
        metrics = PollerMetrics()
        bound = serve(metrics, metrics_address or settings.metrics_address)
        poller = Poller(st, the_app, name=name, metrics=metrics,
                        config=PollerConfig(poll_interval_s=poll_interval, concurrency=concurrency,
                                            max_rate=max_rate, max_shard_rate=max_shard_rate))
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        if coord is None:
            poller.start(owned or ())
            typer.echo(f"{poller.name}: polling shards {shards} of {st.url}", err=True)
        else:
            fleet = Fleet(poller, coord, store_release_s=store_failure_release)
            fleet.start()
            typer.echo(f"{poller.name}: joined the fleet ({coordinator or settings.coordinator}) "
                       f"on {st.url}", err=True)
        if bound:
            typer.echo(f"{poller.name}: metrics on http://{bound}/metrics", err=True)
        while not stop.wait(0.5):
            if coord is not None and fleet.ended.is_set():
                break
        if coord is None:
            poller.stop()
        else:
            fleet.stop()
        st.close()
        if coord is not None and fleet.ended.is_set():
            typer.echo(f"{poller.name}: ZooKeeper session lost; exiting so a supervisor restarts it",
                       err=True)
            raise typer.Exit(3)


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
    from . import cli_ops  # noqa: F401  (registers the operators' commands on the app)

    app()
