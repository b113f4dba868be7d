"""The recurring-schedule operations of the client library (``Client.recurring``).

Every call validates all of its input first: bad input raises ``InvalidInput`` and
writes nothing. A change is fenced by the schedule's version (a lightweight transaction
in Cassandra), so two concurrent changes cannot both win (``ScheduleConflict``).

``create`` and ``update`` write the first occurrence of the (new) version; the poller
writes every later one from the previous one. ``delete`` keeps the row as ``deleted``
with a bumped version: its pending occurrences are superseded (none fires), and a
schedule created again under the same id starts a fresh chain.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..domain.durations import MAX_S
from ..domain.effects import Sleep, Steps, call
from ..domain.flow import DEFAULT_PRIORITY, check_key, check_priority
from ..domain.httptarget import HTTP_KIND, check_schedulable
from ..domain.jobspec import loads
from ..domain.model import Status, check_kind, encode_payload
from ..errors import InvalidInput, ScheduleConflict, ScheduleNotFound
from ..recurring import chain
from ..recurring.rule import Rule, parse_duration
from ..recurring.schedule import (
    DEFAULT_CATCHUP_WINDOW_S,
    Misfire,
    Overlap,
    Schedule,
    State,
    aware_ms,
    check_jitter,
    check_schedule_id,
    check_window,
    choice,
    occurrence_id,
)
from . import occurrences as writes

if TYPE_CHECKING:
    from .producer import Producer

T = TypeVar("T")

_UNSET: Any = object()
# How many past nominal times ``view`` looks through for the last one that fired.
LAST_FIRED_LOOKBACK = 10


def _seconds(value: str | int, flag: str, allow_zero: bool = False) -> int:
    """Whole seconds of a duration given as text or as a number of seconds; ``InvalidInput``
    for anything else (a bool, a float, a negative number)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0 or (value == 0 and not allow_zero):
            raise InvalidInput(f"{flag} {value} must be {'at least 0' if allow_zero else 'longer than zero'}")
        if value > MAX_S:  # as for text: a number past any store's integers would fail the write
            raise InvalidInput(f"{flag} {value} s is longer than {MAX_S} s (ten years)")
        return value
    if not isinstance(value, str):
        raise InvalidInput(f"{flag} must be a duration such as 30s or a whole number of seconds, "
                           f"got {type(value).__name__}")
    return parse_duration(value, flag, allow_zero=allow_zero)


class RecurringOps:
    """The operations as effect generators (``scheduler.domain.effects``), for both clients."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.clock = producer.clock

    def _retrying(self, make: Callable[[], Steps[T]]) -> Steps[T]:
        return self.producer.retrying(make)

    # --- building -------------------------------------------------------------------

    def _build(self, schedule_id: str, base: Schedule | None, *, kind: Any, cron: Any, every: Any,
               tz: Any, payload: Any, start: Any, end: Any, overlap: Any, misfire: Any,
               catchup_window: Any, jitter: Any, priority: Any = _UNSET, key: Any = _UNSET) -> Schedule:
        """A validated schedule from the options given (unset ones from ``base``)."""
        now = self.clock.now_ms()
        check_schedule_id(schedule_id)
        kind = check_kind(base.kind if kind is _UNSET and base is not None else kind)
        start_ms = (base.start_ms if base else None) if start is _UNSET else aware_ms(start, "--start")
        end_ms = (base.end_ms if base else None) if end is _UNSET else aware_ms(end, "--end")
        if end is not _UNSET and end_ms is not None and end_ms <= now:
            # Nothing would ever fire: refused rather than stored as a schedule that is over.
            raise InvalidInput(f"--end {end.isoformat()} is in the past: give a future time, or "
                               "`recurring delete` the schedule to stop it")
        check_window(start_ms, end_ms)
        if cron is _UNSET and every is _UNSET and base is not None:
            rule = Rule.parse(base.rule.cron, base.rule.every_s, base.rule.tz if tz is _UNSET else tz,
                              base.rule.anchor_ms if start is _UNSET else (start_ms or now))
        else:
            anchor = start_ms if start_ms is not None else (
                base.rule.anchor_ms if base is not None and base.rule.every_s else now)
            rule = Rule.parse(None if cron is _UNSET else cron, None if every is _UNSET else every,
                              (base.rule.tz if base else None) if tz is _UNSET else tz, anchor)
        if payload is _UNSET:
            data, is_json = (base.payload, base.payload_json) if base else (b"null", True)
        else:
            data, is_json = encode_payload(payload, self.producer.max_payload_bytes)

        if kind == HTTP_KIND:
            check_schedulable(payload if payload is not _UNSET else
                              (loads(data, "the schedule's payload") if is_json else data),
                              self.producer.http_allow)

        def pick(value: Any, attr: str, default: Any) -> Any:
            return (getattr(base, attr) if base else default) if value is _UNSET else value

        return Schedule(
            schedule_id=schedule_id, kind=kind, rule=rule, payload=data, payload_json=is_json,
            start_ms=start_ms, end_ms=end_ms,
            overlap=choice(Overlap, pick(overlap, "overlap", Overlap.ALLOW), "--overlap"),
            misfire=choice(Misfire, pick(misfire, "misfire", Misfire.FIRE_ONCE), "--misfire"),
            catchup_window_s=_seconds(pick(catchup_window, "catchup_window_s", DEFAULT_CATCHUP_WINDOW_S),
                                      "--catchup-window", allow_zero=True),
            jitter_s=check_jitter(_seconds(pick(jitter, "jitter_s", 0), "--jitter", allow_zero=True)),
            priority=check_priority(pick(priority, "priority", DEFAULT_PRIORITY)),
            key=None if (k := pick(key, "key", None)) is None else check_key(k),
            version=base.version if base else 1, state=base.state if base else State.ACTIVE,
            created_ms=base.created_ms if base else now, updated_ms=now)

    # --- changes --------------------------------------------------------------------

    def create(self, schedule_id: str, *, kind: str, cron: str | None = None, every: str | int | None = None,
               tz: str | None = None, payload: Any = None, start: datetime | None = None,
               end: datetime | None = None, overlap: str = "allow", misfire: str = "fire_once",
               catchup_window: str | int = DEFAULT_CATCHUP_WINDOW_S,
               jitter: str | int = 0, priority: int = DEFAULT_PRIORITY,
               key: str | None = None) -> Steps[Schedule]:
        new = self._build(schedule_id, None, kind=kind, cron=cron, every=every, tz=tz, payload=payload,
                          start=start, end=end, overlap=overlap, misfire=misfire,
                          catchup_window=catchup_window, jitter=jitter, priority=priority, key=key)
        for _ in range(3):
            old = yield from self._read(schedule_id)
            if old is not None and old.state is not State.DELETED:
                if old.same_definition(new):
                    return old
                raise ScheduleConflict(f"schedule {schedule_id!r} exists with another definition: "
                                       "use `recurring update`, or delete it first")
            if old is None:
                if (yield from call("insert_schedule", new)):
                    break
            else:  # re-created after a delete: a new version, a fresh chain (bullmq#3063)
                new = replace(new, version=old.version + 1)
                if (yield from call("replace_schedule", new, old.version)):
                    break
        else:
            raise ScheduleConflict(f"schedule {schedule_id!r} keeps changing; try again")
        yield from self._start_chain(new)
        return new

    def update(self, schedule_id: str, **changes: Any) -> Steps[Schedule]:
        names = ("kind", "cron", "every", "tz", "payload", "start", "end", "overlap", "misfire",
                 "catchup_window", "jitter", "priority", "key")  # key=None: no key from now on
        unknown = set(changes) - set(names)
        if unknown:
            raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
        old = yield from self.get(schedule_id)
        opts = {k: changes.get(k, _UNSET) for k in names}
        if opts["cron"] is not _UNSET and opts["every"] is _UNSET:
            opts["every"] = None
        elif opts["every"] is not _UNSET and opts["cron"] is _UNSET:
            opts["cron"] = None
        new = replace(self._build(schedule_id, old, **opts), version=old.version + 1)
        yield from self._replace(new, old)
        yield from self._start_chain(new)
        return new

    def pause(self, schedule_id: str) -> Steps[Schedule]:
        old = yield from self.get(schedule_id)
        new = replace(old, state=State.PAUSED, updated_ms=self.clock.now_ms())
        if old.state is not State.PAUSED:
            yield from self._replace(new, old)
        return new

    def resume(self, schedule_id: str) -> Steps[Schedule]:
        old = yield from self.get(schedule_id)
        new = replace(old, state=State.ACTIVE, updated_ms=self.clock.now_ms())
        if old.state is not State.ACTIVE:
            yield from self._replace(new, old)
        # Two: an occurrence read while the schedule was paused got no successor, and it
        # may be the first one after now.
        yield from self._start_chain(new, count=2)
        return new

    def delete(self, schedule_id: str) -> Steps[None]:
        old = yield from self.get(schedule_id)
        yield from self._replace(replace(old, state=State.DELETED, version=old.version + 1,
                                         updated_ms=self.clock.now_ms()), old)

    def _replace(self, new: Schedule, old: Schedule) -> Steps[None]:
        # The version guards the change; pause and resume keep it, so they are fenced
        # against an update or a delete that bumped it, not against each other.
        if not (yield from call("replace_schedule", new, old.version)):
            raise ScheduleConflict(f"schedule {old.schedule_id!r} changed meanwhile; read it and try again")
        # A poller may still use a decision read just before this change for this long
        # (occurrences.py): wait it out, so that nothing the change forbids fires once
        # it has returned.
        yield Sleep(chain.DECISION_FRESH_S)

    def _start_chain(self, s: Schedule, count: int = 1) -> Steps[None]:
        """Write the occurrences at the first ``count`` nominal times after now
        (idempotent: the same rows as the ones the poller writes from the previous
        occurrence)."""
        if s.state is not State.ACTIVE:
            return
        now = self.clock.now_ms()
        jobs = []
        t: int | None = now - 1
        for _ in range(count):
            t = s.first_after(t) if t is not None else None
            if t is None:
                break
            jobs.append((yield from writes.place(self.producer, s, t, now)))
        if jobs:
            yield from self._retrying(lambda: writes.write(self.producer, jobs))

    def check(self, repair: bool = False) -> Steps[list[Schedule]]:
        from ..observe.chains import find_broken

        broken = yield from self._retrying(lambda: find_broken(self.clock.now_ms()))
        if repair:
            for s in broken:
                yield from self._start_chain(s)
        return broken

    # --- views ----------------------------------------------------------------------

    def _read(self, schedule_id: str) -> Steps[Schedule | None]:
        found = yield from self._retrying(lambda: call("get_schedules", [schedule_id]))
        return found.get(schedule_id)  # type: ignore[no-any-return]

    def get(self, schedule_id: str) -> Steps[Schedule]:
        check_schedule_id(schedule_id)
        s = yield from self._read(schedule_id)
        if s is None or s.state is State.DELETED:
            raise ScheduleNotFound(f"no recurring schedule {schedule_id!r}")
        return replace(s, skipped=(yield from call("skipped", schedule_id)))

    def page(self, after: str | None, limit: int) -> Steps[tuple[list[Schedule], str | None]]:
        found = yield from self._retrying(lambda: call("list_schedules", after, limit))
        following = found[-1].schedule_id if len(found) == limit else None
        return [s for s in found if s.state is not State.DELETED], following

    def list(self) -> Steps[list[Schedule]]:
        found = yield from self._retrying(lambda: call("list_schedules"))
        return [s for s in found if s.state is not State.DELETED]

    def view(self, s: Schedule) -> Steps[dict[str, Any]]:
        now = self.clock.now_ms()
        nxt = s.first_after(now) if s.state is State.ACTIVE else None
        times: list[int] = []
        t: int | None = now
        while t is not None and len(times) < LAST_FIRED_LOOKBACK:
            t = s.rule.back(t if not times else t - 1)
            if t is None or (s.start_ms is not None and t < s.start_ms):
                break
            times.append(t)
        ids = {occurrence_id(s.schedule_id, s.version, t): t for t in times}
        found = (yield from call("get_many", list(ids))) if ids else {}
        fired = [ids[j.job_id] for j in found.values() if j.status is Status.FIRED]
        return s.to_dict(nxt, max(fired) if fired else None)


class RunSteps(Protocol):
    """Performs an operation's effects on the store and returns its result (``Client.run``)."""

    def __call__(self, steps: Steps[T], /) -> T: ...


class Recurring:
    """``Client.recurring``: the operations of ``RecurringOps``, performed synchronously
    by ``run``. The client builds it; this module never imports the client."""

    def __init__(self, producer: Producer, run: RunSteps) -> None:
        self.ops = RecurringOps(producer)
        self._run = run

    def create(self, schedule_id: str, **options: Any) -> Schedule:
        """Create a schedule and write its first occurrence (options: ``kind`` (required),
        ``cron`` or ``every``, ``tz``, ``payload``, ``start``, ``end``, ``overlap``,
        ``misfire``, ``catchup_window``, ``jitter``, ``priority``, ``key``: every
        occurrence has the schedule's priority and key). The same id with the same
        definition is a no-op; with another, ``ScheduleConflict``."""
        return self._run(self.ops.create(schedule_id, **options))

    def update(self, schedule_id: str, **changes: Any) -> Schedule:
        """Change any option of ``create``; bumps the version, so pending occurrences of
        the old definition do not fire, and writes the first occurrence of the new one."""
        return self._run(self.ops.update(schedule_id, **changes))

    def pause(self, schedule_id: str) -> Schedule:
        """Stop firing: pending occurrences are skipped (counted as paused), and the
        times that fall while paused are never caught up."""
        return self._run(self.ops.pause(schedule_id))

    def resume(self, schedule_id: str) -> Schedule:
        """Fire again from the next nominal time after now."""
        return self._run(self.ops.resume(schedule_id))

    def delete(self, schedule_id: str) -> None:
        """Nothing of the schedule fires after this returns (its pending occurrences are
        superseded: checked when each is dispatched)."""
        self._run(self.ops.delete(schedule_id))

    def check(self, repair: bool = False) -> list[Schedule]:
        """The active schedules whose chain broke (see ``check.py``); with ``repair``,
        each goes on from the next time after now."""
        return self._run(self.ops.check(repair))

    def get(self, schedule_id: str) -> Schedule:
        """The schedule (with its skipped count); ``ScheduleNotFound`` when there is
        none or it was deleted."""
        return self._run(self.ops.get(schedule_id))

    def page(self, after: str | None = None, limit: int = 100) -> tuple[list[Schedule], str | None]:
        """One page of the schedules not deleted (at most ``limit`` rows read, in the
        store's order), and the ``after`` of the next page (None: this was the last)."""
        return self._run(self.ops.page(after, limit))

    def list(self) -> list[Schedule]:
        """Every schedule not deleted."""
        return self._run(self.ops.list())

    def view(self, s: Schedule) -> dict[str, Any]:
        """``recurring get``'s JSON: the schedule with its next nominal fire time and the
        last nominal time that fired (looked up among the last few occurrences)."""
        return self._run(self.ops.view(s))
