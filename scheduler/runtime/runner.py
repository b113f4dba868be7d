"""``run_poller``: a poller as a process, for ``scheduler run`` or any program that
embeds one. It opens the store and the coordinator, serves metrics, installs signal
handlers, runs a fleet member (or fixed shards) until told to stop, and returns the
process's exit code:

| code | meaning | a supervisor should |
|---|---|---|
| 0 | stopped on SIGTERM/SIGINT (or ``stop``): checkpoints saved, shards released | nothing |
| 3 | the ZooKeeper session expired: ownership may be stale | restart it |
| 4 | the poller failed: an internal thread crashed, or too many handlers hung | restart it |

Bad settings raise ``SchedulerError`` (``ConfigError``...) before anything starts;
``scheduler run`` prints them as one line and exits 1. What it opened (the store and the
coordinator it was given as URLs, the metrics server, the poller, its signal handlers)
is closed on every way out, a start-up that fails half-way included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import signal
import threading
from collections.abc import Callable, Iterable

from ..domain.dispatch import App, Handler
from ..errors import InvalidInput
from ..fleet.coord import DEFAULT_SESSION_TIMEOUT_S, Coordinator, open_coordinator
from ..observe import tracing
from ..observe.metrics import PollerMetrics, serve
from ..poller import Poller, PollerConfig
from ..settings import Settings, cassandra_security, http_signing_secret
from ..store import Store, open_store
from .gctune import thresholds, tune_gc
from .member import Fleet

log = logging.getLogger("scheduler.run")

EXIT_OK = 0
EXIT_SESSION_LOST = 3
EXIT_FAILED = 4


def run_poller(app: App | Handler, *, settings: Settings | None = None,
               store: Store | str | None = None, shards: Iterable[int] | None = None,
               coordinator: Coordinator | str | None = None,
               config: PollerConfig | None = None, name: str | None = None,
               metrics_address: str | None = None,
               session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
               store_failure_release_s: float = 30.0, dc_failover_s: float = 30.0,
               dc: str | None = None,
               stop: threading.Event | None = None, install_signals: bool = True,
               gc_thresholds: str | tuple[int, int, int] | None = None,
               announce: Callable[[str], None] | None = None) -> int:
    """Run one poller until SIGTERM/SIGINT or ``stop`` is set; returns the exit code
    (see the module's table).

    ``app``: a ``scheduler.App`` or one handler function for every kind. ``store``: a
    store or its URL (default: the settings'). ``shards``: own exactly these, with no
    coordination; otherwise join the fleet of ``coordinator`` (default: the settings').
    ``metrics_address``: HOST:PORT or ``off`` (default: the settings'). ``dc``: the DC
    the member advertises to the fleet (default: the store's, else the settings').
    ``dc_failover_s``: how long a home DC may have no member before the others take its
    shards (and have one again before they give them back). Signal handlers
    are installed only from the main thread. ``gc_thresholds``: the garbage collector's
    thresholds while it runs (``gctune.thresholds``: ``"poller"``, ``"keep"``, ``"A,B,C"``
    or a tuple; default: the settings'), restored when it returns.
    ``announce`` receives the start-up lines (default: the log).
    """
    settings = settings or Settings.from_env()
    say = announce or log.info
    if store_failure_release_s < 0:
        raise InvalidInput("store_failure_release_s must be >= 0 (0: never release)")
    if not dc_failover_s >= 0:  # nan too
        raise InvalidInput("dc_failover_s must be >= 0")
    the_app = app if isinstance(app, App) else App.for_function(app)
    the_app.is_async()  # a mixed app is refused before anything starts
    gc_wanted = thresholds(settings.gc_thresholds if gc_thresholds is None else gc_thresholds)
    stop = stop or threading.Event()
    # Before the poller exists: its workers see whether attempts are traced when made.
    tracing.setup(process=True)
    with contextlib.ExitStack() as opened:
        opened.callback(tracing.flush)  # the last spans out, after the poller stopped
        if gc_wanted is not None:  # process-wide, like the signal handlers: see gctune.py
            opened.callback(gc.set_threshold, *tune_gc(gc_wanted))
        # Whatever is opened here is closed on every way out, in reverse order: a
        # start-up step that fails (the coordinator unreachable, the metrics port taken,
        # no schema) leaves nothing open, and neither does an exception while it runs.
        poller, fleet = _start(the_app, settings, store, shards, coordinator, config, name,
                               metrics_address, session_timeout_s,
                               (store_failure_release_s, dc_failover_s, dc),
                               stop, install_signals, say, opened)
        while not stop.wait(0.5):
            if poller.failed.is_set() or (fleet is not None and fleet.ended.is_set()):
                break
    if poller.failure is not None:
        say(f"{poller.name}: {poller.failure}; exiting {EXIT_FAILED} so a supervisor restarts it")
        return EXIT_FAILED
    if fleet is not None and fleet.ended.is_set():
        say(f"{poller.name}: ZooKeeper session lost; exiting {EXIT_SESSION_LOST} so a supervisor "
            "restarts it")
        return EXIT_SESSION_LOST
    return EXIT_OK


def _start(app: App, settings: Settings, store: Store | str | None, shards: Iterable[int] | None,
           coordinator: Coordinator | str | None, config: PollerConfig | None, name: str | None,
           metrics_address: str | None, session_timeout_s: float,
           fleet_opts: tuple[float, float, str | None], stop: threading.Event, install_signals: bool,
           say: Callable[[str], None],
           opened: contextlib.ExitStack) -> tuple[Poller, Fleet | None]:
    """``run_poller``'s start-up: each thing it opens or starts has its close pushed on
    ``opened`` as soon as it exists (a poller's or fleet's stop before the start, which
    may fail half-way), so the caller's exit closes them whether this returns or raises.
    A store given as an object is the caller's to close; a coordinator given as an object
    is stopped only by the fleet's stop, once a fleet was made with it (as on a planned
    stop)."""
    # Read first: a secret file that cannot be used stops the start before anything opens.
    secret = (None if settings.http_signing_secret_file is None
              else http_signing_secret(settings.http_signing_secret_file))
    if isinstance(store, Store):
        st = store
    else:
        st = open_store(settings.require_store(store), security=cassandra_security(), dc=settings.dc)
        opened.callback(st.close)
    store_failure_release_s, dc_failover_s, dc = fleet_opts
    # The DC the store was opened for (a Cassandra store's resolved --dc / local_dc).
    member_dc = dc or getattr(getattr(st, "cfg", None), "dc", None) or settings.dc
    fixed = None if shards is None else sorted(set(shards))
    if fixed is not None:
        check_fixed_shards(fixed, st.layouts().all_shards())
    coord: Coordinator | None = None
    fleet: Fleet | None = None
    if fixed is None:
        if coordinator is None or isinstance(coordinator, str):
            coord = open_coordinator(coordinator or settings.coordinator, session_timeout_s=session_timeout_s,
                                     dc=member_dc)
            opened.callback(_stop_unless_fleet, coord, lambda: fleet)
        else:
            coord = coordinator
    metrics = PollerMetrics()
    server = serve(metrics, metrics_address or settings.metrics_address)
    if server is not None:
        opened.callback(server.close)
    config = with_settings(config or PollerConfig(notify_address=settings.notify_address), settings)
    if install_signals and threading.current_thread() is threading.main_thread():
        # Restored after the poller's stop (pushed later, so run earlier): a second
        # SIGTERM while it stops gracefully must not end the process.
        for sig in (signal.SIGTERM, signal.SIGINT):
            opened.callback(signal.signal, sig, signal.signal(sig, lambda *_: stop.set()))
    poller = Poller(st, app, name=name, metrics=metrics, config=config, signing_secret=secret)
    opened.callback(poller.stop)  # also when its start fails half-way; after the fleet's, a no-op
    if coord is None:
        poller.start(fixed or ())
        say(f"{poller.name}: polling shards {_spans(fixed or [])} of {st.url}")
    else:
        fleet = Fleet(poller, coord, store_release_s=store_failure_release_s, failover_s=dc_failover_s)
        opened.callback(fleet.stop)
        fleet.start()
        where = coordinator if isinstance(coordinator, str) else settings.coordinator
        say(f"{poller.name}: joined the fleet ({where}) on {st.url}")
    if server is not None:
        say(f"{poller.name}: metrics on http://{server.address}/metrics")
    return poller, fleet


def with_settings(config: PollerConfig, settings: Settings) -> PollerConfig:
    """``config`` with the producer settings it leaves unset (None) taken from
    ``settings``: the poller writes occurrences as the process's producers write jobs
    (the same layout cache age and nudges), and guards HTTP targets with the process's
    allow list. Those it sets are kept."""
    return dataclasses.replace(
        config,
        layout_cache_ttl_s=(settings.layout_cache_ttl_s if config.layout_cache_ttl_s is None
                            else config.layout_cache_ttl_s),
        nudge=settings.nudge if config.nudge is None else config.nudge,
        http_allow=settings.http_allow if config.http_allow is None else config.http_allow)


def _stop_unless_fleet(coord: Coordinator, fleet: Callable[[], Fleet | None]) -> None:
    """Stop a coordinator ``run_poller`` opened, unless a fleet was made with it: the
    fleet's stop stops it (a second stop is not promised to be harmless)."""
    if fleet() is None:
        coord.stop()


def check_fixed_shards(shards: list[int], count: int) -> None:
    """``InvalidInput`` unless every one of ``shards`` exists in a store whose layouts
    have at most ``count`` shards (a poller on shard 99 of 16 would poll nothing, and
    say nothing)."""
    if not shards:
        raise InvalidInput("no shards to poll: give --shards N, N-M or a list of them")
    missing = [n for n in shards if n >= count]
    if missing:
        raise InvalidInput(f"shards {_spans(missing)} do not exist: the store's layouts have shards "
                           f"{_spans(list(range(count)))}; give shards in that range "
                           "(`scheduler shards show`)")


def _spans(shards: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2,5``."""
    out: list[str] = []
    for s in shards:
        if out and out[-1].split("-")[-1] == str(s - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{s}"
        else:
            out.append(str(s))
    return ",".join(out) or "none"
