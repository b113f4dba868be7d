"""``scheduler console``: serve the web console (``scheduler/console``) until SIGTERM or
SIGINT. Registered on the app of ``scheduler.cli_common``."""

from __future__ import annotations

from typing import Annotated

import typer

from .cli_common import StoreOpt, app, client_for, errors
from .cli_ops import CoordOpt
from .errors import ConfigError, InvalidInput


@app.command()
def console(
    address: Annotated[str, typer.Option(help="Serve on HOST:PORT.")] = "127.0.0.1:9470",
    allow_actions: Annotated[bool, typer.Option(
        "--allow-actions", help="Allow replay, cancel, pause/resume and re-fire, to people who sign "
                                "in with SCHEDULER_CONSOLE_TOKEN(_FILE). Off: read-only.")] = False,
    sample_interval: Annotated[float, typer.Option(
        help="Seconds between reads of lag and owners for the fleet page.")] = 30.0,
    store: StoreOpt = None,
    coordinator: CoordOpt = None,
) -> None:
    """Serve the web console: fleet and lag heatmap, buckets, jobs, recurring schedules,
    dead letters and the audit. Read-only unless --allow-actions."""
    from . import logs
    from .fleetview import read_fleet
    from .settings import Settings, console_token

    logs.setup(json_output=False)
    with errors():
        try:
            import uvicorn

            from .console.app import build
            from .console.guard import Guard
            from .console.pages import Fleet
        except ImportError as exc:
            raise ConfigError(f"the console needs its extra ({exc.name} is missing): "
                              "pip install 'scheduler[console]'") from None
        host, _, port = address.rpartition(":")
        if not port.isdigit() or not host:
            raise InvalidInput(f"--address {address!r} must look like HOST:PORT, e.g. 127.0.0.1:9470")
        if sample_interval < 1:
            raise InvalidInput("--sample-interval must be at least 1 second")
        token = console_token()
        if allow_actions and token is None:
            raise ConfigError("--allow-actions needs a token: put one of 16 or more characters in the "
                              "file named by SCHEDULER_CONSOLE_TOKEN_FILE (or in SCHEDULER_CONSOLE_TOKEN)")
        url = coordinator or Settings.from_env().coordinator
        client = client_for(store)
        fleet = Fleet(client, lambda: read_fleet(url), sample_interval)
        fleet.start()
    mode = "actions on for signed-in users" if allow_actions else "read-only"
    typer.echo(f"console: {client.store.url} on http://{host}:{port}/ ({mode})", err=True)
    try:
        uvicorn.run(build(client, fleet, Guard(token, allow_actions)), host=host.strip("[]"), port=int(port),
                    log_level="warning", access_log=False)
    finally:
        fleet.stop()
        client.close()
