"""The store's administration: ``schema apply``, ``shards show|resize``, ``dead list|replay``,
``refire``. Registered on the app of ``scheduler.cli.main.common``."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ..errors import InvalidInput, SchemaError
from .common import (
    DURATION,
    TIME,
    JsonOpt,
    StoreOpt,
    app,
    cell,
    client_for,
    dead_app,
    emit,
    errors,
    parse_at,
    plain,
    schema_app,
    shards_app,
    store_for,
)

# --- schema -----------------------------------------------------------------------------


@schema_app.command("apply")
def schema_apply(
    store: StoreOpt = None,
    shards: Annotated[int | None, typer.Option(
        help="Shard count S of a new keyspace (default 16); fixed at creation: change it "
             "with `shards resize`.")] = None,
    bucket_width: Annotated[int | None, typer.Option(
        help="Bucket width in seconds of a new keyspace (default 60), fixed at creation.")] = None,
    replication: Annotated[str, typer.Option(
        help="Replication of a new keyspace: simple:RF (one DC), or DC:RF[,DC:RF...] "
             "(NetworkTopologyStrategy, e.g. dc1:2,dc2:1; also nts:DC=RF[,DC=RF]).")] = "simple:1",
    retention: Annotated[str | None, typer.Option(
        metavar=DURATION,
        help="Keep a job's rows this long after it fires, is cancelled or dies (90s, 12h, 7d). "
             "Default 7d for a new keyspace; given for an existing one, changes it.")] = None,
    dead_retention: Annotated[str | None, typer.Option(
        metavar=DURATION,
        help="Keep dead letters this long (default 30d); changes an existing keyspace's.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create the keyspace and tables, or upgrade them; safe to run again. The only
    command that creates a store that does not exist."""
    from ..domain.clock import SystemClock
    from ..domain.durations import whole_seconds
    from ..domain.layout import check_shard_count
    from ..domain.retention import MAX_TTL_S, format_duration
    from ..domain.topology import parse_replication
    from ..store import SchemaOptions

    with errors():
        parse_replication(replication)  # refused before anything is opened
        check_shard_count(16 if shards is None else shards)
        width = 60 if bucket_width is None else bucket_width
        if not 1 <= width <= 3600 or 3600 % width:
            raise InvalidInput(f"--bucket-width {width} must divide 3600 (e.g. 1, 10, 60)")
        keep = None if retention is None else whole_seconds(retention, "--retention", most_s=MAX_TTL_S // 2)
        keep_dead = (None if dead_retention is None
                     else whole_seconds(dead_retention, "--dead-retention", most_s=MAX_TTL_S // 2))
        st = store_for(store, create=True)
        try:
            _check_fixed_at_creation(st, shards, bucket_width)
            res = st.apply_schema(SchemaOptions(shard_count=16 if shards is None else shards,
                                                bucket_width_s=width, replication=replication,
                                                retention_s=keep, dead_retention_s=keep_dead),
                                  SystemClock().now_ms())
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


def _check_fixed_at_creation(st: Any, shards: int | None, bucket_width: int | None) -> None:
    """``InvalidInput`` when ``--shards`` or ``--bucket-width`` differs from an existing
    store's: both are fixed at creation, and ``apply_schema`` would ignore them. Reads
    only; nothing is written before this passes."""
    try:
        count, width = st.layouts().latest.shard_count, st.meta().bucket_width_s
    except SchemaError:
        return  # a new store (or one without layouts yet): the options apply
    if shards is not None and shards != count:
        raise InvalidInput(f"--shards {shards} applies only to a new store; {st.url} has {count} shards "
                           f"(change the count with `scheduler shards resize --count {shards} --at "
                           "<cutover>`, or drop --shards)")
    if bucket_width is not None and bucket_width != width:
        raise InvalidInput(f"--bucket-width {bucket_width} applies only to a new store; {st.url} uses "
                           f"{width}s buckets, fixed at creation (drop --bucket-width)")


# --- shards -----------------------------------------------------------------------------


@shards_app.command("show")
def shards_show(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """List the layouts: from which bucket on which shard count is in force."""
    from ..domain.keys import from_ms

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
    at: Annotated[str, typer.Option(metavar=TIME, help="Cutover: a bucket boundary, ISO 8601.")],
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change S from the bucket at --at on; earlier buckets keep their S."""
    from ..domain.keys import from_ms

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


@shards_app.command("home")
def shards_home(
    dc: Annotated[str | None, typer.Option(
        "--dc", metavar="DC=WEIGHT,...",
        help="Set the home-DC rule: a weight per DC, e.g. dc1=1,dc2=1 (each DC homes about "
             "its weight's share of the shards; 0: none). Left out: print the rule.")] = None,
    clear: Annotated[bool, typer.Option(
        "--clear", help="Remove the rule: every poller may own every shard again.")] = False,
    coordinator: Annotated[str | None, typer.Option(
        help="zookeeper://h1:2181/root of the fleet (default $SCHEDULER_COORDINATOR).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show or set which DC is home to which shards (docs/two-data-centres.md): pollers
    of a shard's home DC own it; pollers of the other DCs take it over only after
    --dc-failover-delay without a live poller there."""
    from ..domain.home import format_weights, homes, parse_weights
    from ..fleet.view import read_home_rule, write_home_rule
    from .common import check_coordinator

    with errors():
        if dc is not None and clear:
            raise InvalidInput("give --dc to set the rule or --clear to remove it, not both")
        weights = parse_weights(dc) if dc is not None else None
        url = check_coordinator(coordinator)
        if weights is not None or clear:
            write_home_rule(url, weights)
        current = read_home_rule(url)
    counts: dict[str, int] = {}
    for home in homes(range(1024), current).values():
        counts[home] = counts.get(home, 0) + 1
    data = {"weights": current, "share_of_1024_shards": counts}

    def human() -> None:
        if not current:
            typer.echo("no home-DC rule: every poller may own every shard")
            return
        typer.echo(f"home DCs: {format_weights(current)}")
        for name, n in sorted(counts.items()):
            typer.echo(f"  {name}: {n / 10.24:.1f}% of the shards")

    emit(data, as_json, human)


# --- dead letters -----------------------------------------------------------------------


@dead_app.command("list")
def dead_list(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Jobs whose retries ran out, or whose kind had no handler."""
    from ..domain.keys import from_ms

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
            table.add_row(cell(r["job_id"]), cell(r["kind"]), str(r["attempts"]), r["died_at"],
                          cell(r["error"] or ""))
        Console().print(table)

    emit(rows, as_json, human)


@dead_app.command("replay")
def dead_replay(
    job_ids: Annotated[list[str] | None, typer.Argument(help="Jobs to replay.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Replay every dead letter.")] = False,
    at: Annotated[str | None, typer.Option(metavar=TIME, help="When to fire them (default: now).")] = None,
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
    from_: Annotated[str, typer.Option("--from", metavar=TIME,
                                       help="Start of the window of firings (ISO time).")],
    to: Annotated[str, typer.Option(metavar=TIME, help="End of the window (ISO time), now or earlier.")],
    kind: Annotated[str | None, typer.Option(help="Only jobs of this kind.")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Show what would be sent; write nothing.")] = False,
    lookback: Annotated[str, typer.Option(
        metavar=DURATION, help="How late a job may have fired in the window and still be found: "
                               "the scan reads buckets this far before --from.")] = "1h",
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Schedule again every job whose firing was recorded in the window, to fire at once
    (same kind and payload; id refire:<window>:<old id>). Running it twice fires once.
    A window that has not ended (--to in the future) is refused."""
    import sys

    from rich.progress import Progress

    from ..domain.clock import SystemClock
    from ..domain.durations import whole_seconds
    from ..domain.keys import to_ms
    from ..observe import refire as rf

    with errors():
        start, end = to_ms(parse_at(from_)), to_ms(parse_at(to))
        rf.check_window(start, end, SystemClock().now_ms())
        lookback_s = whole_seconds(lookback, "--lookback")
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
        + (", ".join(f"{plain(k)} {n}" for k, n in by_kind.items()) or "none")))
