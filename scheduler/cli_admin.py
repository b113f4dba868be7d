"""The shard-layout, dead-letter and re-fire commands: ``shards show|resize``, ``dead list|replay``,
``refire``.
Registered on the app of ``scheduler.cli_common``."""

from __future__ import annotations

from typing import Annotated

import typer

from .cli_common import JsonOpt, StoreOpt, app, client_for, dead_app, emit, errors, parse_at, shards_app
from .errors import InvalidInput

# --- shards -----------------------------------------------------------------------------


@shards_app.command("show")
def shards_show(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """List the layouts: from which bucket on which shard count is in force."""
    from .keys import from_ms

    with errors():
        client = client_for(store)
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
        cutover = parse_at(at)
        client = client_for(store)
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
        client = client_for(store)
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
        when = parse_at(at) if at else None
        client = client_for(store)
        try:
            jobs = client.replay_dead(None if all_ else job_ids, when)
        finally:
            client.close()
    emit({"replayed": [j.job_id for j in jobs]}, as_json,
         lambda: typer.echo(f"replayed {len(jobs)} jobs"))


# --- re-fire ----------------------------------------------------------------------------


@app.command()
def refire(
    from_: Annotated[str, typer.Option("--from", help="Start of the window of firings (ISO time).")],
    to: Annotated[str, typer.Option(help="End of the window (ISO time).")],
    kind: Annotated[str | None, typer.Option(help="Only jobs of this kind.")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Show what would be sent; write nothing.")] = False,
    lookback: Annotated[str, typer.Option(
        help="How late a job may have fired in the window and still be found: the scan reads "
             "buckets this far before --from.")] = "1h",
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Schedule again every job whose firing was recorded in the window, to fire at once
    (same kind and payload; id refire:<window>:<old id>). Running it twice fires once."""
    import sys

    from rich.progress import Progress

    from . import refire as rf
    from .keys import to_ms
    from .retention import parse_duration

    with errors():
        start, end = to_ms(parse_at(from_)), to_ms(parse_at(to))
        if end < start:
            raise InvalidInput("--to is before --from; give a window forwards in time")
        lookback_s = parse_duration(lookback, "--lookback")
        client = client_for(store)
        try:
            with Progress(disable=as_json or not sys.stderr.isatty(), transient=True) as bar:
                task = bar.add_task("finding firings", total=None)
                found = rf.fired_in_window(client.store, start, end, kind, lookback_s,
                                           lambda done, total: bar.update(task, completed=done, total=total))
                specs = rf.specs(found, (start, end))
                if not dry_run and specs:
                    send = bar.add_task("re-firing", total=len(specs))
                    client.schedule_many(specs, progress=lambda n: bar.advance(send, n))
        finally:
            client.close()
    by_kind = rf.counts_by_kind(found)
    data = {"dry_run": dry_run, "window": [from_, to], "count": len(specs), "by_kind": by_kind,
            "jobs": [s.job_id for s in specs]}
    emit(data, as_json, lambda: typer.echo(
        f"{'would re-fire' if dry_run else 're-fired'} {len(specs)} jobs: "
        + (", ".join(f"{k} {n}" for k, n in by_kind.items()) or "none")))
