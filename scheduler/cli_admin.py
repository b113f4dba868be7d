"""The shard-layout and dead-letter commands: ``shards show|resize``, ``dead list|replay``.
Registered on the app of ``scheduler.cli_common``."""

from __future__ import annotations

from typing import Annotated

import typer

from .cli_common import JsonOpt, StoreOpt, client_for, dead_app, emit, errors, parse_at, shards_app
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
