"""A schedule's rule: a cron expression or an interval, in a time zone. Pure: no I/O,
times passed in as epoch milliseconds. Below the store and the recurring API, which
both read it.

- **Cron**: 5 fields (minute hour day-of-month month day-of-week), or an alias
  (``@yearly``, ``@annually``, ``@monthly``, ``@weekly``, ``@daily``, ``@midnight``,
  ``@hourly``), read by cronsim in the schedule's IANA zone. Daylight-saving changes
  follow Debian cron's rule: a job at a fixed local time fires once when the clocks go
  back (the first of the two instants) and at the change when they go forward; a job
  with ``*`` or a step in the minute or hour field fires at every real instant.
- **Interval**: ``every`` N seconds, anchored at the schedule's start: the nominal
  times are ``start + k * every``, whatever the zone.

The next nominal time always comes from the previous nominal time (``after``), never
from now or from when a run completed: no drift.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..domain.durations import whole_seconds
from ..errors import InvalidInput

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# An interval longer than this is surely a typo (and overflows nothing either).
MAX_EVERY_S = 366 * 86400


def parse_duration(text: str, what: str = "duration", *, allow_zero: bool = False) -> int:
    """Whole seconds of ``90s``, ``5m``, ``12h``, ``7d`` or ``90`` (the syntax of every
    duration flag, ``scheduler.domain.durations``); ``InvalidInput`` naming ``what``."""
    return whole_seconds(text, what, allow_zero=allow_zero)


@lru_cache(maxsize=512)
def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``; ``InvalidInput`` for an unknown one."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a directory ("Europe")
        raise InvalidInput(f"unknown time zone {name!r}: use an IANA name such as UTC, "
                           "Europe/Lisbon or America/New_York") from None


@dataclass(frozen=True)
class Rule:
    """``cron`` (as given: an alias stays an alias) or ``every_s``, never both."""

    cron: str | None = None
    every_s: int | None = None
    tz: str = "UTC"
    anchor_ms: int = 0  # an interval's first nominal time (the schedule's start)

    @classmethod
    def parse(cls, cron: str | None = None, every: str | int | None = None, tz: str | None = None,
              anchor_ms: int = 0) -> Rule:
        """Check and build a rule; ``InvalidInput`` with one line saying what is wrong.
        ``tz`` None is UTC; an empty ``tz`` is refused."""
        if (cron is None) == (every is None):
            raise InvalidInput("give exactly one of --cron EXPR or --every DURATION")
        if tz == "":
            # Given, but empty (``--tz ''``, an unset shell variable): a mistake, not UTC.
            raise InvalidInput("--tz is empty: give an IANA zone such as UTC or Europe/Lisbon, "
                               "or leave --tz out for UTC")
        tz = "UTC" if tz is None else tz
        zone(tz)
        if cron is not None:
            cron = " ".join(cron.split())
            _check_cron(cron)
            return cls(cron=cron, tz=tz)
        if isinstance(every, bool) or not isinstance(every, int | str):
            raise InvalidInput(f"--every must be a duration such as 5m or a number of seconds, "
                               f"got {type(every).__name__}")
        seconds = every if isinstance(every, int) else parse_duration(every, "--every")
        if not 0 < seconds <= MAX_EVERY_S:
            raise InvalidInput(f"--every must be between 1s and 366d, got {seconds} s")
        return cls(every_s=seconds, tz=tz, anchor_ms=anchor_ms)

    @property
    def expression(self) -> str | None:
        """The cron expression cronsim reads (an alias expanded)."""
        return None if self.cron is None else ALIASES.get(self.cron.lower(), self.cron)

    def after(self, t_ms: int) -> int:
        """The first nominal time strictly after ``t_ms`` (epoch ms)."""
        if self.every_s is not None:
            step = self.every_s * 1000
            if t_ms < self.anchor_ms:
                return self.anchor_ms
            return self.anchor_ms + ((t_ms - self.anchor_ms) // step + 1) * step
        from cronsim import CronSim

        start = datetime.fromtimestamp(t_ms / 1000, UTC).astimezone(zone(self.tz))
        nxt = next(CronSim(self.expression or "", start))
        return int(nxt.timestamp() * 1000)

    def back(self, t_ms: int, k: int = 1) -> int | None:
        """The ``k``-th latest nominal time at or before ``t_ms`` (1: the latest), or
        None when there is none (before an interval's anchor)."""
        if self.every_s is not None:
            if t_ms < self.anchor_ms:
                return None
            step = self.every_s * 1000
            kth = self.anchor_ms + (t_ms - self.anchor_ms) // step * step - (k - 1) * step
            return kth if kth >= self.anchor_ms else None
        from cronsim import CronSim

        # cronsim's reverse walk yields times strictly before its start.
        start = datetime.fromtimestamp(t_ms / 1000 + 1, UTC).astimezone(zone(self.tz))
        it = CronSim(self.expression or "", start.replace(microsecond=0), reverse=True)
        t: int | None = None
        for _ in range(k):
            t = int(next(it).timestamp() * 1000)
        return t

    def before(self, t_ms: int, count: int) -> list[int]:
        """Up to ``count`` nominal times strictly before ``t_ms``, latest first."""
        out: list[int] = []
        t = t_ms - 1
        for _ in range(count):
            prev = self.back(t)
            if prev is None:
                break
            out.append(prev)
            t = prev - 1
        return out

    def times(self, after_ms: int, count: int) -> list[int]:
        """The next ``count`` nominal times after ``after_ms``."""
        out: list[int] = []
        t = after_ms
        for _ in range(count):
            t = self.after(t)
            out.append(t)
        return out



def _check_cron(expr: str) -> None:
    from cronsim import CronSim, CronSimError

    fields = ALIASES.get(expr.lower(), expr).split()
    if expr.startswith("@") and expr.lower() not in ALIASES:
        raise InvalidInput(f"cron alias {expr!r} is unknown: use one of {', '.join(ALIASES)}")
    if len(fields) != 5:
        raise InvalidInput(f"cron expression {expr!r} has {len(fields)} fields; it needs 5 "
                           "(minute hour day-of-month month day-of-week) or an alias such as @daily")
    try:
        CronSim(" ".join(fields), datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise InvalidInput(f"cron expression {expr!r} is not valid: {exc}") from None
