"""``scheduler recurring ...``: recurring schedules. Registered on the app of
``scheduler.cli.main.common``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from ..errors import InvalidInput
from .common import (
    DURATION,
    TIME,
    JsonOpt,
    StoreOpt,
    app,
    cell,
    client_for,
    emit,
    errors,
    fail,
    parse_at,
    plain,
)

recurring_app = typer.Typer(no_args_is_help=True, help="Recurring schedules: cron or intervals.")
app.add_typer(recurring_app, name="recurring")

CronOpt = Annotated[str | None, typer.Option("--cron", help="5 fields, or @hourly, @daily, ...")]
EveryOpt = Annotated[str | None, typer.Option("--every", metavar=DURATION,
                                              help="An interval: 30s, 5m, 12h, 1d.")]
TzOpt = Annotated[str | None, typer.Option("--tz", help="IANA time zone (default UTC).")]


@recurring_app.command("preview")
def preview(
    cron: CronOpt = None,
    every: EveryOpt = None,
    tz: TzOpt = None,
    from_: Annotated[str | None, typer.Option("--from", metavar=TIME, help="Start after this time, ISO 8601 "
                                              "(default now; an interval is anchored here).")] = None,
    count: Annotated[int, typer.Option(help="How many times to show.")] = 10,
    as_json: JsonOpt = False,
) -> None:
    """The next nominal fire times of a rule, in its zone (nothing is written)."""
    from ..domain.clock import SystemClock
    from ..domain.keys import from_ms, to_ms
    from ..recurring import Rule
    from ..recurring.rule import zone

    with errors():
        if not 1 <= count <= 1000:
            raise InvalidInput(f"--count must be between 1 and 1000, got {count}")
        start = to_ms(parse_at(from_)) if from_ else SystemClock().now_ms()
        rule = Rule.parse(cron, every, tz, anchor_ms=start)
        # An interval's first time is its anchor; a cron rule's is strictly after --from.
        times = rule.times(start - 1 if every is not None else start, count)
        shown = [from_ms(t).astimezone(zone(rule.tz)).isoformat() for t in times]
    emit({"fire_times": shown}, as_json, lambda: typer.echo("\n".join(shown)))


# --- create and change ------------------------------------------------------------------

KindOpt = Annotated[str | None, typer.Option("--kind", help="The kind every occurrence has.")]
PayloadOpt = Annotated[str | None, typer.Option("--payload", help="JSON payload of every occurrence.")]
StartOpt = Annotated[str | None, typer.Option("--start", metavar=TIME,
                                              help="First possible time, ISO 8601 (an interval is "
                                                   "anchored here; default now).")]
EndOpt = Annotated[str | None, typer.Option("--end", metavar=TIME,
                                            help="No occurrence after this, ISO 8601 (in the future).")]
OverlapOpt = Annotated[str | None, typer.Option("--overlap", help="allow (default), skip or buffer_one.")]
WindowOpt = Annotated[str | None, typer.Option("--catchup-window", metavar=DURATION,
                                               help="How far back missed times are caught up (1h).")]
MisfireOpt = Annotated[str | None, typer.Option("--misfire", help="fire_once (default), fire_all or skip.")]
JitterOpt = Annotated[str | None, typer.Option("--jitter", metavar=DURATION,
                                               help="Spread each fire time by up to this.")]
PriorityOpt = Annotated[str | None, typer.Option("--priority", metavar="0-9",
                                                 help="Every occurrence's priority (default 5).")]
KeyOpt = Annotated[str | None, typer.Option("--key", metavar="KEY",
                                            help="Every occurrence's key (see `schedule --key`).")]


def _options(kind: str | None, cron: str | None, every: str | None, tz: str | None, payload: str | None,
             start: str | None, end: str | None, overlap: str | None, catchup_window: str | None,
             misfire: str | None, jitter: str | None, priority: str | None = None,
             key: str | None = None) -> dict[str, Any]:
    """The options given on the command line, parsed (``InvalidInput`` on bad ones),
    before the store is read: a bad value is refused even for a schedule that does not
    exist."""
    from ..domain.flow import check_key, parse_priority
    from ..domain.jobspec import loads
    from ..recurring.rule import parse_duration

    out: dict[str, Any] = {}
    if priority is not None:
        out["priority"] = parse_priority(priority)
    if key is not None:
        out["key"] = check_key(key)
    if payload is not None:
        out["payload"] = loads(payload, "--payload")
    for key, value in (("kind", kind), ("cron", cron), ("tz", tz), ("overlap", overlap),
                       ("misfire", misfire)):
        if value is not None:
            out[key] = value
    for key, flag, value in (("every", "--every", every),
                             ("catchup_window", "--catchup-window", catchup_window),
                             ("jitter", "--jitter", jitter)):
        if value is not None:
            out[key] = parse_duration(value, flag, allow_zero=key != "every")
    for key, value in (("start", start), ("end", end)):
        if value is not None:
            out[key] = parse_at(value)
    return out


def _show(client: Any, schedule: Any, as_json: bool) -> None:
    data = client.recurring.view(schedule)
    rule = data["cron"] or f"every {data['every_s']}s"
    emit(data, as_json, lambda: typer.echo(
        f"{plain(data['schedule_id'])}: {data['state']}, {plain(rule)} ({plain(data['tz'])}), "
        f"next {data['next_fire_at']}, last {data['last_fired_at']}, skipped {data['skipped']}"))


@recurring_app.command("create")
def create(
    schedule_id: Annotated[str, typer.Argument(help="The schedule's id.")],
    cron: CronOpt = None, every: EveryOpt = None, kind: KindOpt = None, payload: PayloadOpt = None,
    tz: TzOpt = None, start: StartOpt = None, end: EndOpt = None, overlap: OverlapOpt = None,
    catchup_window: WindowOpt = None, misfire: MisfireOpt = None, jitter: JitterOpt = None,
    priority: PriorityOpt = None, key: KeyOpt = None, store: StoreOpt = None, as_json: JsonOpt = False,
) -> None:
    """Create a schedule (the same definition again is a no-op)."""
    with errors():
        if kind is None:
            raise InvalidInput("--kind is required")
        opts = _options(kind, cron, every, tz, payload, start, end, overlap, catchup_window, misfire, jitter,
                        priority, key)
    _act("create", schedule_id, store, as_json, **opts)


@recurring_app.command("update")
def update(
    schedule_id: Annotated[str, typer.Argument(help="The schedule's id.")],
    cron: CronOpt = None, every: EveryOpt = None, kind: KindOpt = None, payload: PayloadOpt = None,
    tz: TzOpt = None, start: StartOpt = None, end: EndOpt = None, overlap: OverlapOpt = None,
    catchup_window: WindowOpt = None, misfire: MisfireOpt = None, jitter: JitterOpt = None,
    priority: PriorityOpt = None, key: KeyOpt = None, store: StoreOpt = None, as_json: JsonOpt = False,
) -> None:
    """Change a schedule: a new version; pending occurrences of the old one do not fire."""
    with errors():
        opts = _options(kind, cron, every, tz, payload, start, end, overlap, catchup_window, misfire, jitter,
                        priority, key)
        if not opts:
            raise InvalidInput("nothing to change: give at least one option of `recurring create`")
    _act("update", schedule_id, store, as_json, **opts)


def _act(action: str, schedule_id: str, store: str | None, as_json: bool, **opts: Any) -> None:
    """Call ``client.recurring.<action>(schedule_id, **opts)`` and show the schedule."""
    with errors():
        client = client_for(store)
        try:
            result = getattr(client.recurring, action)(schedule_id, **opts)
            if result is None:
                emit({"schedule_id": schedule_id, "state": "deleted"}, as_json,
                     lambda: typer.echo(f"{plain(schedule_id)}: deleted"))
            else:
                _show(client, result, as_json)
        finally:
            client.close()


@recurring_app.command("pause")
def pause(schedule_id: str, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Stop firing; the times that fall while paused are never caught up."""
    _act("pause", schedule_id, store, as_json)


@recurring_app.command("resume")
def resume(schedule_id: str, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Fire again from the next time after now."""
    _act("resume", schedule_id, store, as_json)


@recurring_app.command("delete")
def delete(schedule_id: str, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Delete: nothing of the schedule fires after this."""
    _act("delete", schedule_id, store, as_json)


# --- views ------------------------------------------------------------------------------


@recurring_app.command("get")
def get(schedule_id: str, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """One schedule: its rule, state, next and last fire times, skipped count."""
    with errors():
        client = client_for(store)
        try:
            _show(client, client.recurring.get(schedule_id), as_json)
        finally:
            client.close()


@recurring_app.command("list")
def list_(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Every schedule, with its next and last fire times in its zone and in UTC."""
    with errors():
        client = client_for(store)
        try:
            rows = [client.recurring.view(s) for s in client.recurring.list()]
        finally:
            client.close()

    def human() -> None:
        from rich.console import Console
        from rich.table import Table

        def both(iso: str | None) -> str:
            if iso is None:
                return "-"
            return f"{iso}\n{datetime.fromisoformat(iso).astimezone(UTC).isoformat()}"

        table = Table(title=f"{len(rows)} recurring schedules")
        for col in ("schedule", "state", "rule", "tz", "next (zone / UTC)", "last (zone / UTC)", "skipped"):
            table.add_column(col)
        for r in rows:
            rule = r["cron"] or f"every {r['every_s']}s"
            table.add_row(cell(r["schedule_id"]), cell(r["state"]), cell(rule), cell(r["tz"]),
                          both(r["next_fire_at"]), both(r["last_fired_at"]), str(r["skipped"]))
        Console().print(table)

    emit(rows, as_json, human)


@recurring_app.command("check")
def check(
    repair: Annotated[bool, typer.Option("--repair", help="Restart each broken chain from "
                                                          "the next time after now.")] = False,
    store: StoreOpt = None, as_json: JsonOpt = False,
) -> None:
    """Schedules whose chain of occurrences broke (nothing would fire again); exit 1,
    with the report on stdout and one error line, when there are some and --repair was
    not given."""
    with errors():
        client = client_for(store)
        try:
            broken = [s.schedule_id for s in client.recurring.check(repair)]
        finally:
            client.close()
    emit({"broken": broken, "repaired": repair}, as_json,
         lambda: typer.echo(f"{len(broken)} broken chains{' (repaired)' if repair else ''}"
                            + "".join(f"\n  {plain(b)}" for b in broken)))
    if broken and not repair:
        fail(f"{len(broken)} recurring schedules will never fire again (restart them with "
             "`scheduler recurring check --repair`)")
