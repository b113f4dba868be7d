"""``scheduler console``: serve the web console (``scheduler/console``) until SIGTERM or
SIGINT. Registered on the app of ``scheduler.cli_common``."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Annotated

import typer

from .cli_common import StoreOpt, app, client_for, errors
from .cli_ops import CoordOpt
from .errors import ConfigError, InvalidInput
from .security import is_loopback


@app.command()
def console(
    address: Annotated[str, typer.Option(help="Serve on HOST:PORT.")] = "127.0.0.1:9470",
    allow_actions: Annotated[bool, typer.Option(
        "--allow-actions", help="Allow replay, cancel, pause/resume and re-fire, to people who sign "
                                "in with SCHEDULER_CONSOLE_TOKEN(_FILE). Off: read-only.")] = False,
    sample_interval: Annotated[float, typer.Option(
        help="Seconds between reads of lag and owners for the fleet page.")] = 30.0,
    tls_cert: Annotated[Path | None, typer.Option(
        help="Serve HTTPS with this PEM certificate (chain); needs --tls-key.")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="The PEM private key of --tls-cert.")] = None,
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
        check_tls(tls_cert, tls_key)
        token = console_token()
        if allow_actions and token is None:
            raise ConfigError("--allow-actions needs a token: put one of 16 or more characters in the "
                              "file named by SCHEDULER_CONSOLE_TOKEN_FILE (or in SCHEDULER_CONSOLE_TOKEN)")
        url = coordinator or Settings.from_env().coordinator
        client = client_for(store)
        fleet = Fleet(client, lambda: read_fleet(url), sample_interval)
        fleet.start()
    mode = "actions on for signed-in users" if allow_actions else "read-only"
    scheme = "https" if tls_cert else "http"
    typer.echo(f"console: {client.store.url} on {scheme}://{host}:{port}/ ({mode})", err=True)
    if allow_actions and not tls_cert and not is_loopback(host):
        typer.echo(f"warning: actions over plain HTTP on {host}: the token and the session cookie cross "
                   "the network in the clear; add --tls-cert/--tls-key or serve behind a TLS proxy", err=True)
    try:
        uvicorn.run(build(client, fleet, Guard(token, allow_actions)), host=host.strip("[]"), port=int(port),
                    log_level="warning", access_log=False,
                    ssl_certfile=str(tls_cert) if tls_cert else None,
                    ssl_keyfile=str(tls_key) if tls_key else None)
    finally:
        fleet.stop()
        client.close()


def check_tls(cert: Path | None, key: Path | None) -> None:
    """Raise ``InvalidInput`` unless the pair is absent or loads: uvicorn would otherwise
    fail later with a traceback, after the store is open."""
    if (cert is None) != (key is None):
        raise InvalidInput("--tls-cert and --tls-key go together: give both (PEM files) or neither")
    if cert is None or key is None:
        return
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InvalidInput(f"cannot serve TLS with --tls-cert {cert} and --tls-key {key}: {reason}; "
                           "give a PEM certificate and its unencrypted private key") from None
