"""What every ``scheduler`` command shares: the Typer app and its groups, the common
options, and the one way to print results and errors. Imported by ``cli``,
``cli_admin`` and ``cli_ops``; imports none of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

import typer

from .errors import SchedulerError
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


def client_for(store: str | None) -> Any:
    from .client import Client

    return Client(store, settings=Settings.from_env())


def job_table(job: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=False, box=None)
    for key, value in job.items():
        table.add_row(f"[bold]{key}[/]", "" if value is None else str(value))
    Console().print(table)


def parse_at(text: str) -> Any:
    from .model import parse_time

    return parse_time(text)
