"""Prometheus metrics of one poller, in a registry of its own (several pollers can live
in one process, as in the demo). ``serve`` exposes them over HTTP."""

from __future__ import annotations

import contextlib
import threading
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import HistogramMetricFamily, Metric

from ..errors import ConfigError

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)


class BatchHistogram:
    """A histogram fed in batches by one thread (the recorder), without a lock per
    observation: prometheus_client's Histogram costs more per job than firing it does."""

    def __init__(self, name: str, doc: str, buckets: tuple[float, ...],
                 registry: CollectorRegistry) -> None:
        self.name, self.doc, self.bounds = name, doc, buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        registry.register(self)

    def observe_many(self, values: Iterable[float]) -> None:
        counts, bounds = self.counts, self.bounds
        for v in values:
            counts[bisect_left(bounds, v)] += 1
            self.total += v

    def collect(self) -> Iterator[Metric]:
        cumulative, acc = [], 0
        for bound, n in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            acc += n
            cumulative.append((bound, acc))
        yield HistogramMetricFamily(self.name, self.doc, buckets=cumulative, sum_value=self.total)


def add_process_metrics(registry: CollectorRegistry) -> None:
    """CPU, memory, open files and start time of this process (``process_*``) and the
    Python version (``python_info``): a custom registry lacks the default collectors."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)


class PollerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        add_process_metrics(r)
        self.fired = Counter("scheduler_jobs_fired", "Jobs fired, by kind", ["kind"], registry=r)
        self.lateness = BatchHistogram("scheduler_fire_lateness_seconds", "Handler start minus due time",
                                       LATENESS_BUCKETS, r)
        self.handler_errors = Counter("scheduler_handler_errors", "Handler exceptions", ["kind"],
                                      registry=r)
        self.retries = Counter("scheduler_retries", "Jobs scheduled for a retry", ["kind"], registry=r)
        self.dead = Counter("scheduler_dead_letters", "Jobs dead-lettered", ["kind"], registry=r)
        self.poll_duration = Histogram("scheduler_poll_duration_seconds", "One poll of all owned shards",
                                       registry=r)
        self.rows_read = Counter("scheduler_rows_read", "Bucket rows read", registry=r)
        self.owned_shards = Gauge("scheduler_owned_shards", "Shards this poller owns", registry=r)
        self.checkpoint_lag = Gauge("scheduler_checkpoint_lag_seconds",
                                    "Now minus the end of the last drained bucket", ["shard"], registry=r)
        self.rebalances = Counter("scheduler_rebalances", "Changes of this poller's shard set",
                                  registry=r)
        self.fencing_refusals = Counter("scheduler_fencing_refusals",
                                        "Checkpoint writes refused because ownership moved", registry=r)
        self.clock_skew = Gauge("scheduler_clock_skew_seconds", "Store clock minus poller clock",
                                registry=r)
        self.clock_refusing = Gauge("scheduler_clock_refusing",
                                    "1 while firing is refused for clock skew", registry=r)
        self.throttled = Counter("scheduler_release_throttled",
                                 "Due jobs held back by the dispatch-rate bound", registry=r)
        self.throttled_kind = Counter(
            "scheduler_throttled", "Starts refused by a kind's flow limit, by kind and reason "
            "(rate, concurrency or key)", ["kind", "reason"], registry=r)
        self.deferred = Counter("scheduler_deferred_jobs",
                                "Due jobs of a throttled kind placed later to free the read buffer",
                                ["kind"], registry=r)
        self.held = Gauge("scheduler_held_jobs", "Jobs of a paused kind this poller holds", ["kind"],
                          registry=r)
        self.flow_limit = Gauge("scheduler_flow_limit", "This poller's part of a kind's fleet-wide "
                                "limit: rate (starts per second) or concurrency (handlers)",
                                ["kind", "limit"], registry=r)
        self.buffered = Gauge("scheduler_buffered_jobs", "Jobs read and not yet complete", registry=r)
        self.store_failing = Gauge("scheduler_store_failing_seconds",
                                   "Seconds since the store's calls started failing (0: healthy)",
                                   registry=r)
        self.handler_timeouts = Counter("scheduler_handler_timeouts",
                                        "Handler calls that ran past their timeout", ["kind"],
                                        registry=r)
        self.abandoned_threads = Gauge("scheduler_abandoned_threads",
                                       "Worker threads of timed-out handlers not returned yet",
                                       registry=r)
        self.recurring_fired = Counter("scheduler_recurring_fired",
                                       "Occurrences of recurring schedules fired", registry=r)
        self.recurring_skipped = Counter("scheduler_recurring_skipped",
                                         "Occurrences skipped: overlap, misfire, paused, superseded",
                                         ["reason"], registry=r)
        self.nudged = Counter("scheduler_nudged_jobs",
                              "Due-now jobs taken ahead of the read cursor on a producer's nudge",
                              registry=r)
        self.nudges_rejected = Counter("scheduler_nudges_rejected",
                                       "Datagrams on the nudge socket that were not valid nudges "
                                       "or raised while applied", registry=r)
        self.retired_dropped = Counter("scheduler_retired_dropped",
                                       "Queued rows dropped before dispatch because a producer "
                                       "retired them (moved or cancelled), as the store confirmed",
                                       registry=r)
        self.http_requests = Counter("scheduler_http_requests",
                                     "Requests of HTTP targets (the kind http), by the class of their "
                                     "status: 2xx, 3xx, 4xx, 5xx, or error (no response)", ["code_class"],
                                     registry=r)
        self.http_seconds = Histogram("scheduler_http_request_seconds",
                                      "HTTP targets: from a request's start (its name resolved and its "
                                      "address checked included) to its response, or its failure",
                                      buckets=HTTP_BUCKETS, registry=r)
        self.stepped_out = Gauge("scheduler_fleet_stepped_out",
                                 "1 while this poller has left the fleet because the store fails",
                                 registry=r)
        self.foreign_shards = Gauge("scheduler_fleet_foreign_shards",
                                    "Shards this poller serves whose home is another DC (a take-over), "
                                    "by this poller's DC and the shards' home DC", ["dc", "home_dc"],
                                    registry=r)
        self.caught_up = Counter("scheduler_dc_catchup_moved_total",
                                 "Unfired rows a catch-up (after a fail-back, or a cut to another DC) "
                                 "found behind the checkpoint and moved ahead so they fire", registry=r)

    def forget_shard(self, shard: int) -> None:
        """Drop a shard's series once it is no longer ours: a stale lag would lie."""
        with contextlib.suppress(KeyError):
            self.checkpoint_lag.remove(str(shard))


# Seconds an API request takes, from its first byte read to its response (a batch of
# thousands of jobs takes a second or more).
API_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class ApiMetrics:
    """The metrics of one ``scheduler api`` process. ``route`` is a route's template
    (``/v1/jobs/{id}``), never a job id: ids can number in the millions."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        add_process_metrics(r)
        self.requests = Counter("scheduler_api_requests", "API requests answered, by method, route "
                                "and status code", ["method", "route", "code"], registry=r)
        self.duration = Histogram("scheduler_api_request_duration_seconds", "Time to answer an API "
                                  "request, by method and route", ["method", "route"],
                                  buckets=API_DURATION_BUCKETS, registry=r)
        self.jobs = Counter("scheduler_api_jobs", "Jobs in POST /v1/jobs and /v1/jobs/batch, by the "
                            "status each got (201, 400, 409)", ["status"], registry=r)


class MetricsServer:
    """A ``/metrics`` HTTP server running in a thread of its own, and the address it bound."""

    def __init__(self, server: WSGIServer, thread: threading.Thread, address: str) -> None:
        self._server, self._thread, self.address = server, thread, address

    def close(self) -> None:
        """Stop serving and free the port (the listening socket is closed, so the same
        address can be bound again at once); idempotent."""
        if self._thread.is_alive():
            self._server.shutdown()  # returns once serve_forever has (it checks every 0.5 s)
            self._thread.join()
        self._server.server_close()


def serve(metrics: PollerMetrics, address: str) -> MetricsServer | None:
    """Serve a poller's ``/metrics`` on ``address`` (``off`` serves nothing); the caller
    closes the server. Raises ``ConfigError`` as ``start_server``."""
    if address == "off":
        return None
    return start_server(metrics.registry, address)


def serve_registry(registry: CollectorRegistry, address: str) -> str:
    """``start_server`` for a process that serves until it exits: the address bound."""
    return start_server(registry, address).address


def start_server(registry: CollectorRegistry, address: str) -> MetricsServer:
    """Serve ``/metrics`` on ``HOST:PORT`` (a bare ``PORT`` or ``:PORT`` binds 127.0.0.1;
    port 0 picks a free one). Raises ``ConfigError`` for a malformed or unusable address,
    having bound nothing."""
    from prometheus_client import start_http_server

    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"metrics address {address!r} is not HOST:PORT (e.g. 127.0.0.1:9460, or off)")
    try:
        server, thread = start_http_server(int(port), addr=host, registry=registry)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror}; "
                          "pass another HOST:PORT (or off)") from None
    return MetricsServer(server, thread, f"{host}:{server.server_port}")
