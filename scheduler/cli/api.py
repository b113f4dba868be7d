"""``scheduler api``: serve the HTTP API for producers (``scheduler/api``) until SIGTERM or
SIGINT. Registered on the app of ``scheduler.cli.main.common``.

As for ``console``: everything that can be refused (the address, the TLS files, the
tokens file, the store) is checked before the server starts, each as one ``error:``
line and exit 1, and the socket is bound here, not inside uvicorn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import ConfigError
from ..observe import tracing
from ..security import is_loopback
from .common import StoreOpt, app, errors, store_for
from .console import bind, check_tls, parse_address, serve

# How long one request rides out store errors before it answers 503 (a producer's
# default is 10 s; a caller of an HTTP API is better served by a quick 503 it can retry).
STORE_RETRY_S = 2.0

DEFAULT_ADDRESS = "127.0.0.1:9480"


@app.command()
def api(
    address: Annotated[str, typer.Option(help="Serve on HOST:PORT.")] = DEFAULT_ADDRESS,
    tls_cert: Annotated[Path | None, typer.Option(
        help="Serve HTTPS with this PEM certificate (chain); needs --tls-key.")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="The PEM private key of --tls-cert.")] = None,
    log_json: Annotated[bool, typer.Option("--log-json", help="JSON log lines.")] = False,
    store: StoreOpt = None,
) -> None:
    """Serve the HTTP API for producers: schedule, move, cancel and read jobs, manage
    recurring schedules and dead letters. Callers send a token of
    SCHEDULER_API_TOKENS_FILE as Authorization: Bearer TOKEN."""
    from .. import logs
    from ..settings import Settings, api_tokens

    logs.setup(json_output=log_json)
    with errors():
        try:
            import uvicorn  # noqa: F401  (the extra is there, before the socket is bound)

            from ..api.app import build
            from ..api.tokens import Tokens
            from ..producer.client import Client
        except ImportError as exc:
            raise ConfigError(f"the API needs its extra ({exc.name} is missing): "
                              "pip install 'scheduler[api]'") from None
        host, port = parse_address(address, DEFAULT_ADDRESS)
        check_tls(tls_cert, tls_key)
        tokens = Tokens(api_tokens())
        sock = bind(host, port)
        try:
            st = store_for(store, for_loads=True)  # a missing embedded store is refused, not created
            try:
                tracing.setup(process=True)  # OTLP, when configured: spans of the jobs written
                client = Client(st, settings=Settings.from_env(), retry_s=STORE_RETRY_S)
            except BaseException:
                st.close()
                raise
            client._owns_store = True  # opened here, so the client's close is its close
        except BaseException:
            sock.close()
            raise
    scheme = "https" if tls_cert else "http"
    shown = f"[{host}]" if ":" in host else host
    bound = sock.getsockname()[1]  # the system's choice for port 0
    typer.echo(f"api: {client.store.url} on {scheme}://{shown}:{bound}/ ({len(tokens)} tokens)", err=True)
    if not tls_cert and not is_loopback(host):
        typer.echo(f"warning: plain HTTP on {host}: bearer tokens cross the network in the clear; add "
                   "--tls-cert/--tls-key or serve behind a TLS proxy", err=True)
    serve(build(client, tokens), sock, tls_cert, tls_key, "the API", on_stop=[client.close, tracing.flush])
