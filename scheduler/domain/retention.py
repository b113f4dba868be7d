"""How long a job's rows are kept: pure rules, no I/O.

A job's rows (its bucket row and its lookup row) expire ``retention`` after the job is
done with: after its fire time once it fired, or after the moment it was cancelled,
rescheduled away or dead-lettered. Cassandra applies this as per-row TTLs computed at
write time (see ``cql/versions/v003_retention.cql`` for why); the embedded store keeps
the same expiry in a column and deletes expired rows in a sweep.

Cassandra caps a TTL at 20 years, and with ``storage_compatibility_mode: CASSANDRA_4``
(Cassandra 5.0's default) it refuses any expiry after 2038-01-19T03:14:06Z. A job whose
rows would expire later than either is refused at ``schedule`` (``check_expiry``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import InvalidInput
from .durations import format_seconds

DEFAULT_RETENTION_S = 7 * 86_400
DEFAULT_DEAD_RETENTION_S = 30 * 86_400
MAX_TTL_S = 630_720_000  # 20 years, Cassandra's limit (cassandra.yaml has no knob for it)
# Integer.MAX_VALUE - 1 seconds: the last expiry a CASSANDRA_4-compatible node stores.
MAX_EXPIRY_MS = 2_147_483_646_000
# gc_grace_seconds of the job tables: the hint window (max_hint_window, 3 h by default),
# or the retention when that is shorter (see v003_retention.cql).
HINT_WINDOW_S = 3 * 3_600


def format_duration(seconds: int) -> str:
    """The shortest exact form: 604800 -> "7d", 90 -> "90s" (the syntax every duration
    flag reads, ``scheduler.domain.durations``)."""
    return format_seconds(seconds)


@dataclass(frozen=True)
class Retention:
    jobs_s: int = DEFAULT_RETENTION_S
    dead_s: int = DEFAULT_DEAD_RETENTION_S

    def after_fire_ms(self, fire_ms: int) -> int:
        """Expiry of a job's rows written before it fires: ``retention`` after its fire time."""
        return fire_ms + self.jobs_s * 1000

    def after_event_ms(self, now_ms: int) -> int:
        """Expiry of a job's rows once it is cancelled or moved away: ``retention`` from now."""
        return now_ms + self.jobs_s * 1000

    def dead_lookup_ms(self, now_ms: int) -> int:
        """A dead job's lookup row stays as long as its dead letter, so a replay finds it."""
        return now_ms + max(self.jobs_s, self.dead_s) * 1000

    def dead_letter_ms(self, now_ms: int) -> int:
        return now_ms + self.dead_s * 1000

    @property
    def gc_grace_s(self) -> int:
        return min(self.jobs_s, HINT_WINDOW_S)


def ttl_s(expires_ms: int, now_ms: int) -> int:
    """The Cassandra TTL that ends at ``expires_ms``: at least 1 (0 would mean "never")."""
    return max(1, min(MAX_TTL_S, math.ceil((expires_ms - now_ms) / 1000)))


def check_expiry(fire_ms: int, retention: Retention, now_ms: int) -> None:
    """Refuse a job whose rows could not be given their expiry."""
    expires = retention.after_fire_ms(fire_ms)
    latest = min(MAX_EXPIRY_MS, now_ms + MAX_TTL_S * 1000)
    if expires > latest:
        from .keys import from_ms

        raise InvalidInput(
            f"due time is too far ahead: with a {format_duration(retention.jobs_s)} retention its rows "
            f"would expire after {from_ms(latest).isoformat()}, the latest expiry Cassandra stores; "
            f"schedule it before {from_ms(latest - retention.jobs_s * 1000).isoformat()}")
