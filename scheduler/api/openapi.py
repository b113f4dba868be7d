"""The OpenAPI 3 document of the API, written by hand from the routes (``app.py``) and
served at ``/openapi.json``. docs/openapi.json is a copy, written by
``python -m scheduler.api.openapi > docs/openapi.json``; a test keeps the two equal, and
checks that the document and the routes name the same paths and methods. Pure."""

from __future__ import annotations

import json
from typing import Any

from .body import MAX_BATCH_JOBS, MAX_BODY_BYTES
from .respond import RETRY_AFTER_S

STR, INT, BOOL = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
TIME = {"type": "string", "format": "date-time"}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "nullable": True}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(props: dict[str, Any], required: tuple[str, ...] = (), extra: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": extra}
    if required:
        out["required"] = list(required)
    return out


ANY: dict[str, Any] = {"description": "any JSON value"}
DURATION = {"oneOf": [{"type": "string", "example": "30s"}, {"type": "integer", "minimum": 0}],
            "description": "a duration: 30s, 5m, 12h, 1d, or whole seconds"}
JOB = obj({
    "job_id": STR, "kind": STR, "due_at": TIME, "fire_at": TIME, "bucket": INT, "shard": INT,
    "status": {"type": "string", "enum": ["pending", "fired", "cancelled", "dead"]},
    "attempts": INT, "fired_at": nullable(TIME), "last_error": nullable(STR),
    "refired_from": nullable(STR), "priority": INT, "key": nullable(STR), "payload": ANY,
    "payload_encoding": {"type": "string", "enum": ["json", "base64"]},
    "refired": nullable({"type": "object"}), "occurrence_of": nullable({"type": "object"}),
    "replays": {"type": "array", "items": {"type": "object"}},
}, extra=True)
JOB_INPUT = obj({
    "id": {"type": "string", "description": "unique per job, 1-256 bytes of UTF-8"},
    "at": {**TIME, "description": "the due time, ISO 8601 with an offset"},
    "kind": {"type": "string", "description": "1-64 of letters, digits, _ . : - (a letter or _ first)"},
    "payload": ANY,
    "priority": {"type": "integer", "minimum": 0, "maximum": 9, "default": 5},
    "key": nullable({"type": "string", "description": "1-256 bytes of UTF-8, no control characters"}),
    "jitter": {"type": "number", "minimum": 0, "maximum": 86400, "default": 0},
}, ("id", "at", "kind"))
RESULT = obj({"id": nullable(STR), "status": {"type": "integer", "enum": [201, 400, 409]},
              "job": ref("Job"), "error": STR}, ("id", "status"))
SCHEDULE_INPUT = obj({
    "kind": STR, "cron": nullable(STR), "every": DURATION, "tz": nullable(STR), "payload": ANY,
    "start": nullable(TIME), "end": nullable(TIME),
    "overlap": {"type": "string", "enum": ["allow", "skip", "buffer_one"], "default": "allow"},
    "misfire": {"type": "string", "enum": ["fire_once", "fire_all", "skip"], "default": "fire_once"},
    "catchup_window": DURATION, "jitter": DURATION,
    "priority": {"type": "integer", "minimum": 0, "maximum": 9, "default": 5}, "key": nullable(STR),
}, ("kind",))
SCHEDULE = obj({
    "schedule_id": STR, "state": {"type": "string", "enum": ["active", "paused"]}, "version": INT,
    "kind": STR, "cron": nullable(STR), "every_s": nullable(INT), "tz": STR, "start": nullable(TIME),
    "end": nullable(TIME), "next_fire_at": nullable(TIME), "last_fired_at": nullable(TIME),
    "overlap": STR, "misfire": STR, "catchup_window_s": INT, "jitter_s": INT, "skipped": INT,
    "priority": INT, "key": nullable(STR),
}, extra=True)
DEAD = obj({"job_id": STR, "kind": STR, "due_at": TIME, "attempts": INT, "error": nullable(STR),
            "died_at": TIME})
SCHEMAS = {
    "Error": obj({"error": {"type": "string", "description": "one line: what was wrong, what to do"}},
                 ("error",)),
    "Job": JOB, "JobInput": JOB_INPUT, "BatchResult": RESULT, "ScheduleInput": SCHEDULE_INPUT,
    "Schedule": SCHEDULE, "DeadLetter": DEAD,
}
ERRORS = {
    400: "bad input (a malformed body, a bad field): nothing was written",
    401: "no bearer token, or not one of SCHEDULER_API_TOKENS_FILE",
    403: "the token's role may not do this",
    404: "no such job or schedule",
    409: "the id is taken by another job, the job is not in a state this allows, or the schedule "
         "changed meanwhile",
    413: f"the body is larger than {MAX_BODY_BYTES} bytes",
    503: f"the store did not answer (Retry-After: {RETRY_AFTER_S}); the same request again is safe",
}


def json_content(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def op(summary: str, ok: dict[int, tuple[str, dict[str, Any]]], errors: tuple[int, ...],
       body: dict[str, Any] | None = None, role: str | None = None,
       params: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """One operation: its successes (status: description, schema), its errors, its body
    and the least role that may call it (None: open to anyone)."""
    out: dict[str, Any] = {"summary": summary + (f" (role {role} or above)" if role else "")}
    if params:
        out["parameters"] = list(params)
    if body is not None:
        out["requestBody"] = {"required": True, "content": json_content(body)}
    responses: dict[str, Any] = {str(s): {"description": d, "content": json_content(schema)}
                                 for s, (d, schema) in ok.items()}
    every = (401, 403, *errors) if role else errors
    for status in every:
        entry: dict[str, Any] = {"description": ERRORS[status], "content": json_content(ref("Error"))}
        if status == 503:
            entry["headers"] = {"Retry-After": {"schema": INT, "description": "seconds to wait"}}
        responses[str(status)] = entry
    out["responses"] = responses
    out["security"] = [{"bearer": []}] if role else []
    return out


ID = ({"name": "id", "in": "path", "required": True, "schema": STR,
       "description": "percent-encoded; may hold /"},)
WRITE = (400, 413, 503)
AT_BODY = obj({"at": TIME}, ("at",))


def document() -> dict[str, Any]:
    """The OpenAPI 3.0 document of every route."""
    job = ("the job, as `scheduler get --json` shows it", ref("Job"))
    schedule = ("the schedule, as `scheduler recurring get --json` shows it", ref("Schedule"))
    status = obj({"status": STR}, ("status",))
    paths: dict[str, Any] = {
        "/v1/jobs": {"post": op(
            "Schedule one job; the same job again answers the same", {201: job}, (*WRITE, 409),
            ref("JobInput"), "producer")},
        "/v1/jobs/batch": {"post": op(
            "Schedule many jobs: one result each, in order", {200: ("a result per job", obj(
                {"results": {"type": "array", "items": ref("BatchResult")}}, ("results",)))},
            WRITE, obj({"jobs": {"type": "array", "items": ref("JobInput"), "maxItems": MAX_BATCH_JOBS}},
                       ("jobs",)), "producer")},
        "/v1/jobs/{id}": {
            "get": op("Show one job", {200: job}, (400, 404, 503), role="reader", params=ID),
            "patch": op("Move a job to a new due time (a fired or cancelled job is armed again; 409 "
                        "for a dead job, which the admin's replay arms)",
                        {200: job}, (*WRITE, 404, 409), AT_BODY, "producer", ID),
            "delete": op("Cancel a pending job (a cancelled one answers the same; 409 for a job "
                         "that fired or is dead)", {200: job}, (400, 404, 409, 503), role="producer",
                         params=ID),
        },
        "/v1/schedules/{id}": {
            "put": op("Create a recurring schedule (201), or make it hold this definition (200)",
                      {201: schedule, 200: schedule}, (*WRITE, 409), ref("ScheduleInput"), "admin", ID),
            "get": op("Show a recurring schedule", {200: schedule}, (400, 404, 503), role="reader",
                      params=ID),
            "delete": op("Delete a recurring schedule: nothing of it fires from now on",
                         {200: ("deleted", obj({"schedule_id": STR, "deleted": BOOL}))},
                         (400, 404, 409, 503), role="admin", params=ID),
        },
        "/v1/schedules/{id}/pause": {"post": op(
            "Pause a schedule", {200: schedule}, (400, 404, 409, 503), role="admin", params=ID)},
        "/v1/schedules/{id}/resume": {"post": op(
            "Resume a schedule from its next time after now", {200: schedule}, (400, 404, 409, 503),
            role="admin", params=ID)},
        "/v1/dead": {"get": op(
            "One page of dead letters", {200: ("a page; next is the after of the following page", obj(
                {"dead": {"type": "array", "items": ref("DeadLetter")}, "next": nullable(STR)}))},
            (400, 503), role="reader", params=(
                {"name": "after", "in": "query", "schema": STR, "description": "the next of the last page"},
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                            "maximum": 1000, "default": 100}}))},
        "/v1/dead/{id}/replay": {"post": op(
            "Arm a dead job again (at the body's at, default now), attempts reset", {200: job},
            (*WRITE, 404), role="admin", params=ID)},
        "/healthz": {"get": op("The process answers", {200: ("alive", status)}, ())},
        "/readyz": {"get": op("The store answers", {200: ("ready", status)}, (503,))},
        "/openapi.json": {"get": op("This document", {200: ("OpenAPI 3", {"type": "object"})}, ())},
        "/metrics": {"get": {"summary": "Prometheus metrics", "security": [], "responses": {
            "200": {"description": "the text exposition format",
                    "content": {"text/plain": {"schema": STR}}}}}},
    }
    replay = paths["/v1/dead/{id}/replay"]["post"]
    replay["requestBody"] = {"required": False, "content": json_content(obj({"at": TIME}))}
    return {
        "openapi": "3.0.3",
        "info": {"title": "scheduler API", "version": "1",
                 "description": "Schedule, move, cancel and read jobs, manage recurring schedules and "
                                "dead letters over HTTP, with the rules of the Python Client. Errors "
                                "are {\"error\": \"one line\"}."},
        "paths": paths,
        "components": {"schemas": SCHEMAS,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


def text() -> str:
    """The document as docs/openapi.json holds it."""
    return json.dumps(document(), indent=2) + "\n"


if __name__ == "__main__":
    print(text(), end="")
