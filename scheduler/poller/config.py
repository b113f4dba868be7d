"""A poller's settings and counters."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..domain.netguard import AllowList
from ..store import StoreMeta

__all__ = ["PollerConfig", "PollerStats", "max_prefetch_ms"]


@dataclass(frozen=True)
class PollerConfig:
    poll_interval_s: float = 1.0
    # Read this far ahead of now (default: as far as the keyspace's late margin allows, see
    # max_prefetch_ms). Reading further ahead costs nothing extra: each poll reads only
    # rows after the cursor.
    prefetch_s: float | None = None
    read_limit: int = 1000
    # Handlers running at once: worker threads, or coroutines for an async app.
    concurrency: int = 16
    queue_ahead: int = 256  # due jobs waiting for a free worker, beyond the running ones
    max_rate: float | None = None  # jobs/s dispatched by this poller
    max_shard_rate: float | None = None  # jobs/s dispatched per shard
    # Rows read and not yet complete, at most: bounds memory whatever the backlog.
    max_buffered: int = 20_000
    shutdown_timeout_s: float = 10.0
    checkpoint_interval_s: float = 1.0
    # How long the recorder lets outcomes gather when they trickle in (slow handlers).
    record_linger_s: float = 0.1
    clock_check_interval_s: float = 30.0
    check_clock: bool = True
    layout_refresh_s: float = 5.0
    # The occurrence writer (occurrences.py) places and writes as a producer does, with
    # these producer settings. None: ``run_poller`` fills them from its ``Settings``
    # (SCHEDULER_LAYOUT_CACHE_TTL_S, SCHEDULER_NUDGE); a poller built without one uses
    # ``layout_refresh_s`` as its layout cache's age and sends nudges. The writer's
    # layouts are never older than the shorter of the two ages: a resize is checked
    # against the producers' TTL, and the writer is a producer.
    layout_cache_ttl_s: float | None = None
    nudge: bool | None = None
    # A handler call running longer counts as a failed attempt ("timed out after N s");
    # a kind's own ``timeout_s`` overrides it. None: no limit. (dramatiq's default.)
    handler_timeout_s: float | None = 600.0
    # Worker threads left behind by timed-out handlers (a thread cannot be killed) that
    # have not returned yet, at most: beyond, the poller stops with a failure so that
    # its supervisor starts a fresh process (see ``Poller.failure``).
    max_abandoned_threads: int = 64
    # Where to listen for producers' nudges about due-now jobs (UDP, HOST:PORT; port 0:
    # any free one; None: no fast path, such jobs fire at now + late margin). The bound
    # address is advertised in the store. See nudge.py.
    notify_address: str | None = "127.0.0.1:0"
    # HTTP targets (the built-in kind ``http``): the exceptions to the guard against
    # private and loopback addresses. None: ``run_poller`` fills it from its ``Settings``
    # (SCHEDULER_HTTP_ALLOW); a poller built without one excepts nothing. (The signing
    # secret is an argument of ``Poller``, never a field here: a config may be printed.)
    http_allow: AllowList | None = None


def max_prefetch_ms(meta: StoreMeta) -> int:
    """How far ahead a poller may read: the late margin less twice the skew bound, so a
    producer's write (fire >= its now + margin) always lands ahead of every cursor."""
    return max(0, meta.late_margin_ms - 2 * meta.max_skew_ms)


@dataclass
class PollerStats:
    """Counters, for reports and tests; never read to make a decision (the shards'
    states are in ``Poller.state``)."""

    fired: int = 0
    retried: int = 0
    dead: int = 0
    reads: int = 0
    rows_read: int = 0
    timed_out: int = 0
    abandoned_threads: int = 0
    nudged: int = 0  # due-now jobs taken ahead of the cursor (nudge.py)
    retired_dropped: int = 0  # queued rows dropped because a producer retired them (nudge.py)
    lost_shards: list[int] = field(default_factory=list)  # every loss, in order
