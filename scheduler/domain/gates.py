"""Admission of one kind on one poller, pure: its gate holds this poller's share of the
kind's fleet-wide rate (a token bucket) and concurrency (slots), and its pause. The fair
queue (``fairqueue.py``) asks the gate before each start."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import InvalidInput
from .flow import Limits
from .ratelimit import TokenBucket


class KindGate:
    """One kind's gate on one poller: a token bucket at this poller's share of the rate and a
    running count capped at its slots. ``update`` changes both live and never mints tokens:
    a bucket rebuilt at a new rate keeps its tokens, capped at the new burst; a share that
    was 0 starts empty (its tokens went to the pollers that had demand). A brand-new limit
    starts full: its burst is allowed once."""

    def __init__(self, kind: str, monotonic: Callable[[], float]) -> None:
        self.kind = kind
        self._mono = monotonic
        self.limits = Limits(kind)
        self.rate_share: float | None = None  # None: no rate limit
        self.slots: int | None = None  # None: no concurrency limit
        self.running = 0
        self._bucket: TokenBucket | None = None

    def update(self, limits: Limits, rate_share: float | None = None, slots: int | None = None) -> None:
        """New limits and my parts of them (default: all of it, a fleet of one)."""
        if limits.kind != self.kind:
            raise InvalidInput(f"limits of {limits.kind!r} given to the gate of {self.kind!r}")
        rate = limits.rate_per_s
        old, was = self._bucket, self.rate_share
        self.limits = limits
        if rate is None:
            self.rate_share, self._bucket = None, None
        else:
            mine = rate if rate_share is None else min(max(0.0, rate_share), rate)
            self.rate_share = mine
            if mine <= 0:
                self._bucket = None
            elif old is None or was != mine or old.burst != self._burst(limits, mine):
                burst = self._burst(limits, mine)
                self._bucket = TokenBucket(mine, burst, self._mono)  # starts full
                keep = burst if was is None else 0.0 if old is None else _tokens(old)
                if keep < burst:
                    self._bucket.try_take(burst - keep)
        conc = limits.concurrency
        self.slots = None if conc is None else conc if slots is None else min(max(0, slots), conc)

    @staticmethod
    def _burst(limits: Limits, mine: float) -> float:
        # Scaled by my fraction so the fleet's bursts sum to the limit's, but at least one
        # token: a bucket that can never hold one never admits (with many pollers on a tiny
        # rate the fleet may then burst a little over; the rate itself still holds).
        assert limits.rate_per_s is not None
        return max(1.0, limits.effective_burst * mine / limits.rate_per_s)

    def try_start(self, now: float | None = None) -> str | None:
        """None and one more running, or the reason it may not start: paused, concurrency,
        rate (checked in that order, so a refused start spends no token). ``now``: the
        monotonic clock read once by the caller for many starts."""
        if self.limits.paused:
            return "paused"
        if self.slots is not None and self.running >= self.slots:
            return "concurrency"
        if self.rate_share is not None and (self._bucket is None or not self._bucket.try_take(1.0, now)):
            return "rate"
        self.running += 1
        return None

    def finished(self, n: int = 1) -> None:
        self.running = max(0, self.running - n)


def _tokens(bucket: TokenBucket) -> float:
    # TokenBucket keeps its level private; wait_s(burst) is the time to refill the missing
    # part, so the level is burst minus that at the rate (rounded against float dust).
    assert bucket.rate is not None
    return round(bucket.burst - bucket.wait_s(bucket.burst) * bucket.rate, 9)


class Gates:
    """The gates of all kinds on one poller; a kind with no limits always starts. Every
    start is counted, limited kind or not, so limits set while handlers of a kind run
    count those handlers (a gate with no limits and none running is dropped)."""

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self._mono = monotonic
        self._gates: dict[str, KindGate] = {}

    def _gate(self, kind: str) -> KindGate:
        gate = self._gates.get(kind)
        if gate is None:
            gate = self._gates[kind] = KindGate(kind, self._mono)
        return gate

    def _drop_idle(self, gate: KindGate) -> None:
        if not gate.limits.limited and gate.running == 0:
            del self._gates[gate.kind]

    def update(self, limits: Limits, rate_share: float | None = None, slots: int | None = None) -> None:
        gate = self._gate(limits.kind)
        gate.update(limits, rate_share, slots)
        self._drop_idle(gate)

    def get(self, kind: str) -> KindGate | None:
        return self._gates.get(kind)

    def try_start(self, kind: str, now: float | None = None) -> str | None:
        return self._gate(kind).try_start(now)

    def hold(self, kind: str) -> None:
        """One more running of ``kind`` without a start (a handler that outlives its
        recorded outcome); freed by one more ``finished``. Nothing for an ungated kind."""
        gate = self._gates.get(kind)
        if gate is not None:
            gate.running += 1

    def finished(self, kind: str, n: int = 1) -> None:
        gate = self._gates.get(kind)
        if gate is not None:
            gate.finished(n)
            self._drop_idle(gate)
