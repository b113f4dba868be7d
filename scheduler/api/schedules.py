"""The recurring-schedule and dead-letter operations of the API, on ``Client.recurring``
and the client's dead-letter calls. Blocking: the routes run them in a thread.

``PUT /v1/schedules/{id}`` takes the fields of ``scheduler recurring create`` and makes
the schedule hold exactly that definition: a new id is created (201); an existing
schedule with the same definition is left as it is, and one with another definition is
updated to it (200 either way), every field left out taking its default as in
``create``. A change racing another one on the same schedule is ``ScheduleConflict``
(409): read it and try again.
"""

from __future__ import annotations

from typing import Any

from ..domain.keys import from_ms
from ..domain.model import check_stored_id
from ..errors import InvalidInput, JobNotFound, ScheduleConflict, ScheduleNotFound
from ..producer.client import Client
from ..recurring.schedule import DEFAULT_CATCHUP_WINDOW_S
from .body import fields, seconds_field, text_field, time_field

# The fields of PUT /v1/schedules/{id}: those of ``recurring create``.
SCHEDULE_FIELDS = ("kind", "cron", "every", "tz", "payload", "start", "end", "overlap", "misfire",
                   "catchup_window", "jitter", "priority", "key")
# What a field left out means (``RecurringOps.create``'s defaults).
DEFAULTS: dict[str, Any] = {"cron": None, "every": None, "tz": None, "payload": None, "start": None,
                            "end": None, "overlap": "allow", "misfire": "fire_once",
                            "catchup_window": DEFAULT_CATCHUP_WINDOW_S, "jitter": 0, "priority": 5,
                            "key": None}
DEAD_PAGE_MAX = 1000


def schedule_options(body: Any) -> dict[str, Any]:
    """The options of ``Client.recurring.create`` from a PUT body, every one given (a
    default for each left out); ``InvalidInput`` for an unknown field or a value of the
    wrong JSON type (the values themselves are checked by ``create``)."""
    body = fields(body, SCHEDULE_FIELDS, "the body")
    opts = dict(DEFAULTS)
    opts["kind"] = text_field(body, "kind", required=True)
    for name in ("cron", "tz", "key"):
        if name in body:
            opts[name] = text_field(body, name)
    for name in ("overlap", "misfire"):
        if body.get(name) is not None:
            opts[name] = text_field(body, name)
    for name in ("start", "end"):
        opts[name] = time_field(body, name)
    for name in ("every", "catchup_window", "jitter"):
        value = seconds_field(body, name)
        if value is not None:
            opts[name] = value
    if "priority" in body:
        opts["priority"] = body["priority"]  # check_priority: a whole number 0-9, not a bool
    if "payload" in body:
        opts["payload"] = body["payload"]
    return opts


class ScheduleOps:
    def __init__(self, client: Client) -> None:
        self.client = client

    def view(self, schedule_id: str) -> dict[str, Any]:
        """``scheduler recurring get --json``; ``ScheduleNotFound``."""
        rec = self.client.recurring
        return rec.view(rec.get(schedule_id))

    def put(self, schedule_id: str, body: Any) -> tuple[int, dict[str, Any]]:
        """(201 or 200, the schedule as ``view``): see the module's docstring."""
        opts = schedule_options(body)
        rec = self.client.recurring
        try:
            rec.get(schedule_id)
        except ScheduleNotFound:
            return 201, rec.view(rec.create(schedule_id, **opts))
        try:
            schedule = rec.create(schedule_id, **opts)  # the same definition: left as it is
        except ScheduleConflict:
            schedule = rec.update(schedule_id, **opts)
        return 200, rec.view(schedule)

    def delete(self, schedule_id: str) -> dict[str, Any]:
        self.client.recurring.delete(schedule_id)
        return {"schedule_id": schedule_id, "deleted": True}

    def pause(self, schedule_id: str) -> dict[str, Any]:
        rec = self.client.recurring
        return rec.view(rec.pause(schedule_id))

    def resume(self, schedule_id: str) -> dict[str, Any]:
        rec = self.client.recurring
        return rec.view(rec.resume(schedule_id))

    # --- dead letters ----------------------------------------------------------------

    def dead(self, after: str | None, limit_text: str | None) -> dict[str, Any]:
        """A page of dead letters, as ``scheduler dead list --json`` rows, and the
        ``after`` of the next page (null: this was the last)."""
        limit = 100
        if limit_text is not None:
            digits = limit_text.isascii() and limit_text.isdigit() and len(limit_text) <= 4
            if not digits or not 1 <= int(limit_text) <= DEAD_PAGE_MAX:
                raise InvalidInput(f"limit must be a whole number from 1 to {DEAD_PAGE_MAX}")
            limit = int(limit_text)
        if after:
            check_stored_id(after)
        page = self.client.dead_letter_page(after or None, limit)
        rows = [{"job_id": d.job_id, "kind": d.kind, "due_at": from_ms(d.due_ms).isoformat(),
                 "attempts": d.attempts, "error": d.error, "died_at": from_ms(d.died_ms).isoformat()}
                for d in page]
        return {"dead": rows, "next": page[-1].job_id if len(page) == limit else None}

    def replay(self, job_id: str, body: Any) -> dict[str, Any]:
        """Re-arm one dead job (at ``body["at"]``, default now); the job as ``scheduler
        get --json``. ``JobNotFound`` when it is not a dead letter."""
        at = None
        if body is not None:
            at = time_field(fields(body, ("at",), "the body"), "at")
        try:
            self.client.replay_dead([job_id], at)
        except JobNotFound:  # its message names the CLI's command
            raise JobNotFound(f"not in the dead letters: {job_id!r} (GET /v1/dead lists them)") from None
        return self.client.describe(job_id).to_dict()

