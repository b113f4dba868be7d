"""What every ``scheduler`` command shares: the Typer app and its groups, the common
options, and the one way to print results and errors. Imported by ``cli``,
``admin`` and ``ops``; imports none of them.

The error contract (docs/CLI.md, "Exit codes") is kept here, for every command at once:
``ContractGroup`` runs the command line and turns whatever escapes a command into its
exit code, so no traceback reaches a user; ``errors``/``fail`` print a runtime error as
one ``error:`` line on stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperGroup
from typer.exceptions import TyperException

from ..errors import SchedulerError
from ..settings import Settings, cassandra_security, debug_enabled

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2  # click's; `scheduler audit` also exits 2 when it finds a lost job
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
# How much of an error message reaches the one line (a message can quote hostile input).
MESSAGE_MAX = 1000


def one_line(message: str) -> str:
    """``message`` on one line (any run of whitespace, newlines included, becomes a
    space), at most ``MESSAGE_MAX`` characters, control and bidi characters escaped (a
    message can quote an id holding a terminal sequence)."""
    text = plain(" ".join(str(message).split()))
    return text if len(text) <= MESSAGE_MAX else text[:MESSAGE_MAX - 3] + "..."


def plain(value: Any) -> str:
    """``value`` as text safe to print on a terminal: control characters (an ESC that
    starts a terminal sequence, a newline) and bidi overrides as ``\\xNN``/``\\uNNNN``.
    For stored or user-given text printed by ``typer.echo``; JSON output stays raw."""
    from ..logs import escape

    return escape(str(value))


def cell(value: Any) -> str:
    """``value`` for rich (``Table.add_row``, ``Console.print``): ``plain``, then rich
    markup escaped, so a stored id like ``a[/]`` or ``[link=...]x[/link]`` is shown as
    it is, never parsed as markup (which can fail after a write, or make a link)."""
    from rich.markup import escape

    return escape(plain(value))


def _unexpected(exc: BaseException) -> int:
    if debug_enabled():
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    what = one_line(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    typer.echo(f"error: unexpected {what} (re-run with SCHEDULER_DEBUG=1 to see the traceback, "
               "and report it)", err=True)
    return EXIT_ERROR


class ContractGroup(TyperGroup):
    """The root command: runs the command line and returns or exits with the code the
    table in docs/CLI.md gives, whatever escapes a command. A usage error is click's
    message (plain, no panel) and 2; a ``SchedulerError`` is one ``error:`` line and 1;
    Ctrl-C is 130; anything else is one ``error: unexpected ...`` line and 1, with the
    traceback only when SCHEDULER_DEBUG=1."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False,
                              windows_expand_args=windows_expand_args, **extra)
            code = rv if isinstance(rv, int) and not isinstance(rv, bool) else EXIT_OK
        except TyperException as exc:  # click's usage errors (typer carries its own click)
            show = getattr(exc, "show", None)
            if show is not None:
                show()
            else:
                typer.echo(f"error: {one_line(exc.format_message())}", err=True)
            code = exc.exit_code
        except typer.Abort:  # end of input at a prompt
            typer.echo("error: aborted (no input)", err=True)
            code = EXIT_ERROR
        except SchedulerError as exc:
            typer.echo(f"error: {one_line(str(exc))}", err=True)
            code = EXIT_ERROR
        except KeyboardInterrupt:
            code = EXIT_INTERRUPTED
        except Exception as exc:
            code = _unexpected(exc)
        if standalone_mode:
            sys.exit(code)
        return code


def version() -> str:
    """The installed distribution's version, else the package's own."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("scheduler")
    except PackageNotFoundError:
        from .. import __version__

        return __version__


app = typer.Typer(cls=ContractGroup, add_completion=False, no_args_is_help=True,
                  pretty_exceptions_enable=False,
                  help="A durable scheduler for future one-shot and recurring jobs. Exit codes: 0 done, "
                       "1 error (one line says what to do), 2 usage; the docs' CLI reference lists them all.")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"scheduler {version()}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True, help="Print the version and exit.")] = False,
          ) -> None:
    pass


schema_app = typer.Typer(no_args_is_help=True, help="Create or upgrade the store's schema.")
shards_app = typer.Typer(no_args_is_help=True, help="Show or change the shard layouts.")
dead_app = typer.Typer(no_args_is_help=True, help="List or replay dead-lettered jobs.")
app.add_typer(schema_app, name="schema")
app.add_typer(shards_app, name="shards")
app.add_typer(dead_app, name="dead")



def _store_given(value: str | None) -> str | None:
    """A ``--store`` given on the command line, checked while it is parsed (before the
    command opens anything); ``ConfigError`` for a malformed URL."""
    from ..store import check_store_url

    return value if value is None else check_store_url(value)


StoreOpt = Annotated[str | None, typer.Option("--store", callback=_store_given,
                                              help="Store URL; default $SCHEDULER_STORE.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
# Every duration flag reads this syntax (scheduler.domain.durations); the metavar marks them.
DURATION = "DURATION"
TIME = "TIME"
F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str) -> None:
    """Print ``message`` as the one ``error:`` line on stderr and exit 1."""
    typer.echo(f"error: {one_line(message)}", err=True)
    raise typer.Exit(EXIT_ERROR)


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


def store_for(store: str | None, *, create: bool = False, for_loads: bool = False,
              dc: str | None = None) -> Any:
    """The store named by ``--store`` or $SCHEDULER_STORE. Only ``schema apply`` passes
    ``create``: for every other command a missing embedded store is an error, never a
    new empty file. ``for_loads`` (a client's writes): requests in flight as
    SCHEDULER_LOAD_CONCURRENCY says, writes at SCHEDULER_WRITE_CONSISTENCY; else the
    driver's default. ``dc`` (``--dc``; else SCHEDULER_DC): the Cassandra DC to use."""
    from ..store import open_store

    settings = Settings.from_env()
    options: dict[str, object] = {"security": cassandra_security(),
                                  "dc": dc if dc is not None else settings.dc}
    if for_loads:
        options["concurrency"] = settings.load_concurrency
        options["consistency"] = settings.write_consistency
    return open_store(settings.require_store(store), create=create, **options)


def client_for(store: str | None) -> Any:
    """A client on the store of ``store_for`` (which must exist); closing the client
    closes the store."""
    from ..producer.client import Client

    st = store_for(store, for_loads=True)
    try:
        client = Client(st, settings=Settings.from_env())
    except BaseException:
        st.close()
        raise
    client._owns_store = True  # opened here, so the client's close is its close
    return client


def given_options(ctx: typer.Context, leave_out: Collection[str] = ()) -> list[str]:
    """The options ``ctx``'s command line gave (not defaults), as arguments for the same
    command in another process: one ``--name=VALUE`` word each (so a value that starts
    with ``-`` or reads ``run`` stays a value), a flag as its name, in the command's
    order; ``leave_out``: parameter names to drop. Built from the parsed values, not from
    ``sys.argv`` (which may hold a program's own arguments): each option's type and
    callback must accept its parsed value again, as those of ``run`` do."""
    out: list[str] = []
    for param in ctx.command.params:
        name = param.name
        if param.param_type_name != "option" or name is None or name in leave_out:
            continue
        source = ctx.get_parameter_source(name)
        if source is None or source.name != "COMMANDLINE":  # a default, or the environment's
            continue
        value = ctx.params[name]
        long = next((o for o in param.opts if o.startswith("--")), param.opts[0])
        if getattr(param, "is_flag", False):
            off = next(iter(param.secondary_opts), None)
            out += [long] if value else [off] if off is not None else []
            continue
        if param.nargs != 1:
            raise TypeError(f"{long}: options of several values are not rebuilt")
        out += [f"{long}={v}" for v in (value if param.multiple else (value,))]
    return out


def check_coordinator(url: str | None) -> str:
    """``url`` (or $SCHEDULER_COORDINATOR, else ``local``), checked before anything
    connects; ``ConfigError`` for a malformed one."""
    from ..fleet.url import check_coordinator_url

    chosen = url or Settings.from_env().coordinator
    check_coordinator_url(chosen)
    return chosen


def duration(text: str, what: str, *, allow_zero: bool = True) -> float:
    """Seconds of a duration flag (``10s``, ``5m``, ``1h``, ``2d``, ``0.5``)."""
    from ..domain.durations import seconds

    return seconds(text, what, allow_zero=allow_zero)


def job_table(job: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=False, box=None)
    for key, value in job.items():
        table.add_row(f"[bold]{cell(key)}[/]", "" if value is None else cell(value))
    Console().print(table)


def parse_at(text: str) -> Any:
    from ..domain.model import parse_time

    return parse_time(text)
