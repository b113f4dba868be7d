"""``scheduler recurring ...``: recurring schedules. Registered on the app of
``scheduler.cli_common``."""

from __future__ import annotations

from typing import Annotated

import typer

from .cli_common import JsonOpt, app, emit, errors, parse_at
from .errors import InvalidInput

recurring_app = typer.Typer(no_args_is_help=True, help="Recurring schedules: cron or intervals.")
app.add_typer(recurring_app, name="recurring")

CronOpt = Annotated[str | None, typer.Option("--cron", help="5 fields, or @hourly, @daily, ...")]
EveryOpt = Annotated[str | None, typer.Option("--every", help="An interval: 30s, 5m, 12h, 1d.")]
TzOpt = Annotated[str | None, typer.Option("--tz", help="IANA time zone (default UTC).")]


@recurring_app.command("preview")
def preview(
    cron: CronOpt = None,
    every: EveryOpt = None,
    tz: TzOpt = None,
    from_: Annotated[str | None, typer.Option("--from", help="Start after this time, ISO 8601 "
                                              "(default now; an interval is anchored here).")] = None,
    count: Annotated[int, typer.Option(help="How many times to show.")] = 10,
    as_json: JsonOpt = False,
) -> None:
    """The next nominal fire times of a rule, in its zone (nothing is written)."""
    from .clock import SystemClock
    from .keys import from_ms, to_ms
    from .recurring import Rule
    from .recurring.rule import zone

    with errors():
        if not 1 <= count <= 1000:
            raise InvalidInput(f"--count must be between 1 and 1000, got {count}")
        start = to_ms(parse_at(from_)) if from_ else SystemClock().now_ms()
        rule = Rule.parse(cron, every, tz, anchor_ms=start)
        # An interval's first time is its anchor; a cron rule's is strictly after --from.
        times = rule.times(start - 1 if every is not None else start, count)
        shown = [from_ms(t).astimezone(zone(rule.tz)).isoformat() for t in times]
    emit({"fire_times": shown}, as_json, lambda: typer.echo("\n".join(shown)))
