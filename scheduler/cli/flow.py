"""``scheduler limits ...`` and ``scheduler kinds ...``: flow control per job kind, set in
the store, which every poller reads about once a second. Registered on the app of
``scheduler.cli.main.common``.

Values are checked by the domain's rules (``scheduler.domain.flow``) before the store is
opened, so a bad one writes nothing. The JSON object of a kind always has the six keys
of ``Limits.to_json``; a kind with nothing set reads as all limits null, not paused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Annotated, Any

import typer

from ..errors import InvalidInput
from .common import JsonOpt, StoreOpt, app, cell, emit, errors, plain, store_for

limits_app = typer.Typer(no_args_is_help=True, help="Flow limits per job kind: rate, burst, concurrency.")
kinds_app = typer.Typer(no_args_is_help=True, help="Pause or resume every job of a kind.")
app.add_typer(limits_app, name="limits")
app.add_typer(kinds_app, name="kinds")

KindArg = Annotated[str, typer.Argument(help="The job kind.")]
# Counts are text, not int: click would call "abc" a usage error (exit 2), while every
# bad value of a limit is the domain's one line and exit 1.
RateOpt = Annotated[str | None, typer.Option(
    "--rate", metavar="N/s|N/m|N/h", help="Starts per second, minute or hour, fleet-wide.")]
BurstOpt = Annotated[str | None, typer.Option(
    "--burst", metavar="N", help="Starts allowed at once above the rate (default: a tenth of a "
                                 "second's, at least 1); needs a rate.")]
ConcurrencyOpt = Annotated[str | None, typer.Option(
    "--concurrency", metavar="N", help="Handlers of the kind running at once, fleet-wide.")]
PerKeyOpt = Annotated[str | None, typer.Option(
    "--per-key-concurrency", metavar="N", help="Handlers running at once per job key, fleet-wide.")]


def _with_store(store: str | None, work: Callable[[Any], Any]) -> Any:
    """``work(store)`` on the store of ``--store``/$SCHEDULER_STORE (which must exist),
    closed afterwards whatever happens."""
    st = store_for(store)
    try:
        return work(st)
    finally:
        st.close()


def _of(rows: list[Any], kind: str) -> Any:
    """``kind``'s limits among ``rows``; a kind with nothing set has no row: no limits."""
    from ..domain.flow import Limits

    return next((r for r in rows if r.kind == kind), Limits(kind))


def _now_ms() -> int:
    from ..domain.clock import SystemClock

    return SystemClock().now_ms()


def _describe(lim: Any) -> str:
    """One line of ``lim``'s limits, for a confirmation."""
    from ..domain.flow import format_rate

    parts = [f"rate {format_rate(lim.rate_per_s)}" if lim.rate_per_s is not None else "",
             f"burst {lim.burst}" if lim.burst is not None else "",
             f"concurrency {lim.concurrency}" if lim.concurrency is not None else "",
             f"per-key concurrency {lim.per_key_concurrency}" if lim.per_key_concurrency is not None else ""]
    text = ", ".join(p for p in parts if p) or "no limits"
    return text + ("; paused" if lim.paused else "")


def _table(rows: list[Any], title: str) -> Callable[[], None]:
    def human() -> None:
        from rich.console import Console
        from rich.table import Table

        from ..domain.flow import format_rate

        table = Table(title=title)
        for col in ("kind", "rate", "burst", "concurrency", "per-key", "paused"):
            table.add_column(col, justify="left" if col in ("kind", "rate", "paused") else "right")
        for r in rows:
            table.add_row(cell(r.kind), "-" if r.rate_per_s is None else format_rate(r.rate_per_s),
                          *("-" if v is None else str(v) for v in (r.burst, r.concurrency,
                                                                   r.per_key_concurrency)),
                          "paused" if r.paused else "no")
        Console().print(table)
    return human


# --- limits -----------------------------------------------------------------------------


@limits_app.command("set")
def limits_set(kind: KindArg, rate: RateOpt = None, burst: BurstOpt = None,
               concurrency: ConcurrencyOpt = None, per_key_concurrency: PerKeyOpt = None,
               store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Set a kind's limits: only those given change (a pause stays). Pollers apply them
    within a few seconds, without a restart."""
    from ..domain.flow import parse_count, parse_rate
    from ..domain.model import check_kind

    with errors():
        check_kind(kind)
        given: dict[str, Any] = {}
        if rate is not None:
            given["rate_per_s"] = parse_rate(rate)
        for name, value in (("burst", burst), ("concurrency", concurrency),
                            ("per_key_concurrency", per_key_concurrency)):
            if value is not None:
                given[name] = parse_count(name, value)
        if not given:
            raise InvalidInput("give at least one limit: --rate N/s|N/m|N/h, --burst N, --concurrency N "
                               "or --per-key-concurrency N (to remove them: `scheduler limits clear KIND`)")

        def work(st: Any) -> Any:
            # The kind's limits as they will be, checked whole (a burst needs a rate, set
            # now or before). Read, then written: a `limits clear` in between can leave a
            # burst without a rate, which limits nothing (a burst applies to a rate).
            replace(_of(st.flow_limits(), kind), **given).check()
            st.set_limits(kind, given.get("rate_per_s"), given.get("burst"), given.get("concurrency"),
                          given.get("per_key_concurrency"), _now_ms())
            return _of(st.flow_limits(), kind)

        lim = _with_store(store, work)
    emit(lim.to_json(), as_json, lambda: typer.echo(f"limits of {plain(kind)}: {_describe(lim)}"))


@limits_app.command("get")
def limits_get(kind: KindArg, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """A kind's limits and pause (a kind with nothing set: no limits, not paused)."""
    from ..domain.model import check_kind

    with errors():
        check_kind(kind)
        lim = _with_store(store, lambda st: _of(st.flow_limits(), kind))
    emit(lim.to_json(), as_json, _table([lim], f"limits of {cell(kind)}"))


@limits_app.command("list")
def limits_list(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Every kind with a limit or a pause, by kind."""
    with errors():
        rows = _with_store(store, lambda st: st.flow_limits())
    title = f"{len(rows)} kind{'' if len(rows) == 1 else 's'} with limits or a pause"
    emit([r.to_json() for r in rows], as_json, _table(rows, title))


@limits_app.command("clear")
def limits_clear(kind: KindArg, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Remove a kind's limits. A pause stays: `kinds resume` ends it."""
    from ..domain.model import check_kind

    with errors():
        check_kind(kind)

        def work(st: Any) -> Any:
            st.clear_limits(kind)
            return _of(st.flow_limits(), kind)

        lim = _with_store(store, work)
    still = f"; it stays paused (`scheduler kinds resume {plain(kind)}` resumes it)" if lim.paused else ""
    emit(lim.to_json(), as_json, lambda: typer.echo(f"cleared the limits of {plain(kind)}{still}"))


# --- kinds ------------------------------------------------------------------------------


def _pause(kind: str, paused: bool, store: str | None, as_json: bool) -> None:
    from ..domain.model import check_kind

    with errors():
        check_kind(kind)

        def work(st: Any) -> Any:
            st.set_paused(kind, paused, _now_ms())
            return _of(st.flow_limits(), kind)

        lim = _with_store(store, work)
    line = (f"paused {plain(kind)}: its due jobs are held until `scheduler kinds resume {plain(kind)}`"
            if paused else f"resumed {plain(kind)}: held jobs fire oldest first, within its limits")
    emit(lim.to_json(), as_json, lambda: typer.echo(line))


@kinds_app.command("pause")
def kinds_pause(kind: KindArg, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Hold every due job of a kind (nothing of it starts) until `kinds resume`; its
    limits stay. Idempotent."""
    _pause(kind, True, store, as_json)


@kinds_app.command("resume")
def kinds_resume(kind: KindArg, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """End a kind's pause: its held jobs fire, oldest first, within its limits. Idempotent."""
    _pause(kind, False, store, as_json)
