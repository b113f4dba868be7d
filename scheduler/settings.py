"""Settings from the environment, read in one place and only when asked (never at import).

| variable | default | meaning |
|---|---|---|
| SCHEDULER_STORE | (none) | store URL, ``cassandra://...`` or ``sqlite:///...`` |
| SCHEDULER_COORDINATOR | local | ``zookeeper://h1:2181,h2:2181/root`` or ``local`` |
| SCHEDULER_MAX_PAYLOAD_BYTES | 65536 | payload size limit checked before writing |
| SCHEDULER_LAYOUT_CACHE_TTL_S | 30 | how long a producer may use cached shard layouts |
| SCHEDULER_LOAD_CONCURRENCY | 128 | requests in flight for bulk loads (old name: SCHEDULER_CONCURRENCY) |
| SCHEDULER_METRICS_ADDRESS | 127.0.0.1:9460 | where `scheduler run` serves /metrics; ``off`` for none |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ConfigError
from .model import DEFAULT_MAX_PAYLOAD_BYTES


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be at least {minimum}")
    return value


@dataclass(frozen=True)
class Settings:
    store_url: str | None = None
    coordinator: str = "local"
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    layout_cache_ttl_s: int = 30
    # Requests in flight for bulk loads. (A poller's handler concurrency is
    # ``PollerConfig.concurrency``, a flag of ``scheduler run``.)
    load_concurrency: int = 128
    metrics_address: str = "127.0.0.1:9460"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        return cls(
            store_url=env.get("SCHEDULER_STORE") or None,
            coordinator=env.get("SCHEDULER_COORDINATOR") or "local",
            max_payload_bytes=_int(env, "SCHEDULER_MAX_PAYLOAD_BYTES", DEFAULT_MAX_PAYLOAD_BYTES),
            layout_cache_ttl_s=_int(env, "SCHEDULER_LAYOUT_CACHE_TTL_S", 30),
            load_concurrency=_int(env, "SCHEDULER_LOAD_CONCURRENCY",
                                  _int(env, "SCHEDULER_CONCURRENCY", 128)),
            metrics_address=env.get("SCHEDULER_METRICS_ADDRESS") or "127.0.0.1:9460",
        )

    def require_store(self, override: str | None = None) -> str:
        url = override or self.store_url
        if not url:
            raise ConfigError(
                "no store given: pass --store URL or set SCHEDULER_STORE "
                "(cassandra://127.0.0.1/scheduler or sqlite:///path/to/file.db)"
            )
        return url
