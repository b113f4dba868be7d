"""The API's routes (Starlette) and what every request goes through.

Each route names the permission it needs (``tokens``). A request is answered in this
order: no or an unknown bearer token, 401; a role without the permission, 403 (both
before a byte of the body is read); then the body (``body``: 413 past 1 MiB, 400 for
anything malformed); then the operation, in a thread, on the ``Client``, whose typed
errors become 400, 404, 409 or 503 (``respond``). Nothing a request sends can make a
500: an error no route foresaw is logged with its traceback and answered with one line.

Open to anyone: ``/healthz`` (the process answers), ``/readyz`` (the store answers: 503
otherwise), ``/openapi.json`` and ``/metrics``. The process keeps no state of its own
but caches (the shard layouts, as every producer): any number of them can serve behind
a load balancer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import InvalidInput, SchedulerError
from ..observe.faults import RateLimitFilter
from ..observe.metrics import ApiMetrics
from ..observe.tracing import TraceparentMiddleware
from ..producer.client import Client
from . import openapi
from .body import MAX_BATCH_JOBS, fields, parse_json, read_body
from .jobs import JobOps
from .respond import RETRY_AFTER_S, ApiError, answer, error, refused, status_of
from .schedules import ScheduleOps
from .tokens import NEEDED, Caller, Permission, Tokens

log = logging.getLogger("scheduler.api")
# Refusals and store failures can come by the thousand (a scanner, an outage): at most
# one line per kind every 30 s, which says how many were held back.
noisy = logging.getLogger("scheduler.api.refused")
noisy.addFilter(RateLimitFilter())
Work = Callable[[Request, Caller | None], Awaitable[Response]]
UNMATCHED = "unmatched"  # the route label of a request no route matched
CHALLENGE = {"www-authenticate": 'Bearer realm="scheduler"'}
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class AnyId(Convertor[str]):
    """An id in a path: any text, line breaks included. Starlette's ``path`` (``.*``)
    stops at a newline, and its ``$`` matches before a final one, so ``/v1/jobs/ab%0A``
    would name the job ``ab``; ``[\\s\\S]`` matches every character."""

    regex = r"[\s\S]*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


ANY_ID = "scheduler_any_id"
register_url_convertor(ANY_ID, AnyId())


def build(client: Client, tokens: Tokens, metrics: ApiMetrics | None = None) -> Starlette:
    """The API's ASGI app over ``client`` (which the caller closes). ``metrics``: the
    registry /metrics serves (default: a new one)."""
    metrics = metrics or ApiMetrics()
    jobs, schedules = JobOps(client), ScheduleOps(client)

    def count(method: str, route: str, status: int, started: float) -> None:
        metrics.requests.labels(method, route, str(status)).inc()
        metrics.duration.labels(method, route).observe(time.perf_counter() - started)

    async def guarded(request: Request, route: str, permission: Permission | None, work: Work) -> Response:
        caller = None
        try:
            if permission is not None:
                caller = tokens.caller(request.headers.get("authorization"))
                if caller is None:
                    noisy.warning("api request refused: no valid bearer token", extra={
                        "action": "api_unauthorized", "route": route, "client": _peer(request)})
                    return error(401, "send Authorization: Bearer TOKEN with a token of "
                                      "SCHEDULER_API_TOKENS_FILE", CHALLENGE)
                if not caller.may(permission):
                    noisy.warning("api request refused: the role lacks the permission", extra={
                        "action": "api_forbidden", "route": route, "who": caller.name})
                    return error(403, f"the {caller.role} role may not {permission}: use a token of "
                                      f"role {NEEDED[permission]}")
            response = await work(request, caller)
        except ApiError as exc:
            return error(exc.status, str(exc), exc.headers)
        except SchedulerError as exc:
            if status_of(exc) == 503:
                noisy.warning("api request failed: the store did not answer", extra={
                    "action": "api_store_unavailable", "route": route, "error": str(exc)})
                # The cause names files and node addresses: for the log, not for callers
                # (/readyz answers anyone).
                return error(503, f"the store did not answer: retry after {RETRY_AFTER_S} s (the API's "
                                  "log has the cause)")
            return refused(exc)
        except Exception:  # a bug: the traceback goes to the log, one line to the caller
            log.exception("api request failed unexpectedly", extra={"action": "api_internal_error",
                                                                    "route": route})
            return error(500, "internal error (logged with its traceback); report it")
        if caller is not None and request.method != "GET":
            log.info("api %s %s by %s: %d", request.method, route, caller.name, response.status_code,
                     extra={"action": "api_write", "who": caller.name, "route": route,
                            "code": response.status_code})
        return response

    def route(path: str, method: str, permission: Permission | None, work: Work) -> Route:
        async def endpoint(request: Request) -> Response:
            started = time.perf_counter()
            response = await guarded(request, path, permission, work)
            count(method, path, response.status_code, started)
            return response
        # ``path`` stays the route's label (metrics, logs: the documented ``{id:path}``);
        # the route itself matches any id.
        return Route(path.replace("{id:path}", f"{{id:{ANY_ID}}}"), endpoint, methods=[method])

    def the_id(request: Request) -> str:
        return str(request.path_params["id"])

    async def json_body(request: Request, empty: Any = ...) -> Any:
        return parse_json(await read_body(request), empty=empty)

    # --- jobs --------------------------------------------------------------------------

    def outcomes(raws: list[Any]) -> list[dict[str, Any]]:
        done = jobs.schedule(raws)
        for o in done:
            metrics.jobs.labels(str(o.status)).inc()
        return [o.to_dict() for o in done]

    async def post_job(request: Request, caller: Caller | None) -> Response:
        raw = await json_body(request)

        def work() -> tuple[int, dict[str, Any]]:
            [one] = outcomes([raw])
            if one["status"] != 201:
                raise ApiError(one["status"], one["error"])
            return 201, jobs.get(one["id"])  # as GET shows it: its history too

        status, view = await run_in_threadpool(work)
        return answer(view, status)

    async def post_batch(request: Request, caller: Caller | None) -> Response:
        body = fields(await json_body(request), ("jobs",), "the body")
        raws = body.get("jobs")
        if not isinstance(raws, list):
            raise InvalidInput('the body must be {"jobs": [job, ...]}')
        if len(raws) > MAX_BATCH_JOBS:
            # Each job's result is larger than the smallest job: without a cap, 1 MiB of
            # empty objects would be answered with tens of MB of errors.
            raise InvalidInput(f"{len(raws)} jobs in one batch; at most {MAX_BATCH_JOBS}: split it")
        return answer({"results": await run_in_threadpool(outcomes, raws)})

    async def get_job(request: Request, caller: Caller | None) -> Response:
        return answer(await run_in_threadpool(jobs.get, the_id(request)))

    async def patch_job(request: Request, caller: Caller | None) -> Response:
        body = await json_body(request)
        return answer(await run_in_threadpool(jobs.reschedule, the_id(request), body))

    async def delete_job(request: Request, caller: Caller | None) -> Response:
        return answer(await run_in_threadpool(jobs.cancel, the_id(request)))

    # --- schedules and dead letters -----------------------------------------------------

    async def put_schedule(request: Request, caller: Caller | None) -> Response:
        body = await json_body(request)
        status, view = await run_in_threadpool(schedules.put, the_id(request), body)
        return answer(view, status)

    def schedule_op(op: Callable[[str], dict[str, Any]]) -> Work:
        async def work(request: Request, caller: Caller | None) -> Response:
            return answer(await run_in_threadpool(op, the_id(request)))
        return work

    async def dead(request: Request, caller: Caller | None) -> Response:
        q = request.query_params
        return answer(await run_in_threadpool(schedules.dead, q.get("after"), q.get("limit")))

    async def replay(request: Request, caller: Caller | None) -> Response:
        body = await json_body(request, empty=None)
        return answer(await run_in_threadpool(schedules.replay, the_id(request), body))

    # --- open to anyone -----------------------------------------------------------------

    async def healthz(request: Request, caller: Caller | None) -> Response:
        return answer({"status": "ok"})

    async def readyz(request: Request, caller: Caller | None) -> Response:
        await run_in_threadpool(client.store.meta)  # a read: StoreUnavailable is a 503
        return answer({"status": "ready"})

    async def openapi_json(request: Request, caller: Caller | None) -> Response:
        return answer(openapi.document())

    async def metrics_text(request: Request, caller: Caller | None) -> Response:
        return Response(generate_latest(metrics.registry), headers={"cache-control": "no-store"},
                        media_type=CONTENT_TYPE_LATEST)

    read, write, admin = Permission.READ, Permission.WRITE_JOBS, Permission.ADMIN
    routes = [
        route("/v1/jobs", "POST", write, post_job),
        route("/v1/jobs/batch", "POST", write, post_batch),
        route("/v1/jobs/{id:path}", "GET", read, get_job),
        route("/v1/jobs/{id:path}", "PATCH", write, patch_job),
        route("/v1/jobs/{id:path}", "DELETE", write, delete_job),
        route("/v1/schedules/{id:path}/pause", "POST", admin, schedule_op(schedules.pause)),
        route("/v1/schedules/{id:path}/resume", "POST", admin, schedule_op(schedules.resume)),
        route("/v1/schedules/{id:path}", "PUT", admin, put_schedule),
        route("/v1/schedules/{id:path}", "GET", read, schedule_op(schedules.view)),
        route("/v1/schedules/{id:path}", "DELETE", admin, schedule_op(schedules.delete)),
        route("/v1/dead", "GET", read, dead),
        route("/v1/dead/{id:path}/replay", "POST", admin, replay),
        route("/healthz", "GET", None, healthz),
        route("/readyz", "GET", None, readyz),
        route("/openapi.json", "GET", None, openapi_json),
        route("/metrics", "GET", None, metrics_text),
    ]

    async def unmatched(request: Request, exc: Exception) -> Response:
        """404 for a path no route has, 405 for a method a path does not take."""
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        headers = dict(exc.headers or {}) if isinstance(exc, HTTPException) else {}
        message = ("no such method here: see /openapi.json" if status == 405
                   else "no such path: see /openapi.json")
        method = request.method if request.method in METHODS else "other"  # a label's values stay few
        metrics.requests.labels(method, UNMATCHED, str(status)).inc()
        return error(status, message, headers)

    # Each request under its incoming W3C traceparent: the jobs it writes are in its trace.
    app = Starlette(routes=routes, exception_handlers={404: unmatched, 405: unmatched})
    app.add_middleware(TraceparentMiddleware)
    return app


def _peer(request: Request) -> str:
    return request.client.host if request.client else "?"
