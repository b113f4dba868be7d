"""``scheduler console``: serve the web console (``scheduler/console``) until SIGTERM or
SIGINT. Registered on the app of ``scheduler.cli.main.common``.

Everything that can be refused is checked before the store is opened, and the listening
socket is bound here rather than inside uvicorn: a bad or busy address is then one line
(``error: ...``, exit 1), not uvicorn's traceback or its exit 3 (which ``scheduler``
keeps for a lost ZooKeeper session), and ``--address HOST:0`` can print the port the
system chose.
"""

from __future__ import annotations

import errno
import signal
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import ConfigError, InvalidInput
from ..security import is_loopback
from .common import DURATION, StoreOpt, app, client_for, duration, errors, fail
from .ops import CoordOpt


@app.command()
def console(
    address: Annotated[str, typer.Option(help="Serve on HOST:PORT.")] = "127.0.0.1:9470",
    allow_actions: Annotated[bool, typer.Option(
        "--allow-actions", help="Allow replay, cancel, pause/resume and re-fire, to people who sign "
                                "in with SCHEDULER_CONSOLE_TOKEN(_FILE). Off: read-only.")] = False,
    sample_interval: Annotated[str, typer.Option(
        metavar=DURATION, help="Time between reads of lag and owners for the fleet page (at least 1s).")
    ] = "30s",
    tls_cert: Annotated[Path | None, typer.Option(
        help="Serve HTTPS with this PEM certificate (chain); needs --tls-key.")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="The PEM private key of --tls-cert.")] = None,
    store: StoreOpt = None,
    coordinator: CoordOpt = None,
) -> None:
    """Serve the web console: fleet and lag heatmap, buckets, jobs, recurring schedules,
    dead letters and the audit. Read-only unless --allow-actions."""
    from .. import logs
    from ..fleet.view import read_fleet
    from ..settings import Settings, console_token

    logs.setup(json_output=False)
    with errors():
        try:
            import uvicorn  # noqa: F401  (the extra is there, before the socket is bound)

            from ..console.app import build
            from ..console.guard import Guard
            from ..console.pages import Fleet
        except ImportError as exc:
            raise ConfigError(f"the console needs its extra ({exc.name} is missing): "
                              "pip install 'scheduler[console]'") from None
        host, port = parse_address(address)
        interval_s = duration(sample_interval, "--sample-interval")
        if interval_s < 1:
            raise InvalidInput("--sample-interval must be at least 1 second")
        check_tls(tls_cert, tls_key)
        token = console_token()
        if allow_actions and token is None:
            raise ConfigError("--allow-actions needs a token: put one of 16 or more characters in the "
                              "file named by SCHEDULER_CONSOLE_TOKEN_FILE (or in SCHEDULER_CONSOLE_TOKEN)")
        url = coordinator or Settings.from_env().coordinator
        sock = bind(host, port)
        try:
            client = client_for(store)  # a missing embedded store is refused, not created
        except BaseException:
            sock.close()
            raise
        fleet = Fleet(client, lambda: read_fleet(url), interval_s)
        fleet.start()
    mode = "actions on for signed-in users" if allow_actions else "read-only"
    scheme = "https" if tls_cert else "http"
    shown = f"[{host}]" if ":" in host else host
    bound = sock.getsockname()[1]  # the system's choice for port 0
    typer.echo(f"console: {client.store.url} on {scheme}://{shown}:{bound}/ ({mode})", err=True)
    if allow_actions and not tls_cert and not is_loopback(host):
        typer.echo(f"warning: actions over plain HTTP on {host}: the token and the session cookie cross "
                   "the network in the clear; add --tls-cert/--tls-key or serve behind a TLS proxy", err=True)
    # On a loopback address only loopback Host names are answered (no DNS rebinding);
    # on any other, the operator's proxy or network decides which names reach it.
    app = build(client, fleet, Guard(token, allow_actions), loopback_hosts=is_loopback(host))
    serve(app, sock, tls_cert, tls_key, "the console", on_stop=[fleet.stop, client.close])


def serve(asgi: Any, sock: socket.socket, tls_cert: Path | None, tls_key: Path | None, what: str,
          on_stop: list[Callable[[], object]]) -> None:
    """Serve ``asgi`` with uvicorn on ``sock`` until SIGTERM or SIGINT (exit 0 then),
    then close the socket and call ``on_stop`` in order. A failed start or a crash of the
    server ends in one ``error:`` line naming ``what``, never a traceback."""
    import uvicorn

    config = uvicorn.Config(asgi, log_level="warning",
                            access_log=False, ssl_certfile=str(tls_cert) if tls_cert else None,
                            ssl_keyfile=str(tls_key) if tls_key else None)
    server = uvicorn.Server(config)
    failure = None
    # uvicorn stops gracefully on SIGTERM, then raises it again for the handler it found
    # there: a no-op, so the stop ends in the clean-up below and exit 0, as for SIGINT.
    # A SIGTERM before uvicorn installs its own handler still stops the server.
    previous = signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass  # uvicorn stopped cleanly, then passed SIGINT on: a normal stop, as for SIGTERM
    except SystemExit:  # uvicorn's exit on a failed start (its code 3 means something else here)
        failure = f"{what} did not start (see the lines above)"
    except Exception as exc:  # one line, never a traceback
        failure = f"{what} stopped: {type(exc).__name__}: {exc}"
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
        for stop in on_stop:
            stop()
    if failure:
        fail(f"{failure} (check --address and the TLS files)")


def parse_address(address: str, example: str = "127.0.0.1:9470") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as (host without brackets, port). Raises
    ``InvalidInput`` (naming ``example``, the command's default) unless the port is a
    number of 0-65535 (0: the system picks one)."""
    host, _, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise InvalidInput(f"--address {address!r} must look like HOST:PORT with a port of 0-65535, "
                           f"e.g. {example}")
    return host, int(port)


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (uvicorn listens on it). Raises ``ConfigError``
    with one line when the address is in use, not this host's, or not allowed; nothing is
    left open then."""
    try:
        family, kind, proto, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise ConfigError(f"cannot resolve the host of --address {host}:{port} ({exc}); give an IP "
                          "address or a name this machine resolves") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        sock.bind(where)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"address {host}:{port} is in use (choose another with --address)") from None
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (give an address of "
                          "this machine and a free port with --address)") from None
    return sock


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
