"""The console's routes (Starlette). Reads go through ``pages``; actions need
``--allow-actions``, a signed-in session and the form's CSRF token (``guard``), ask the
browser to confirm when they destroy or send, and are logged with ``action=`` and who.

Errors become a page with one line: 400 for bad input, 404 for an unknown job, 403 for a
refused action, 503 when the store cannot be read. Nothing is written on any of them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from .. import refire as rf
from ..client import Client
from ..errors import InvalidInput, JobNotFound, ScheduleNotFound, SchedulerError
from ..keys import from_ms
from ..observe import shard_ranges
from . import pages
from .guard import COOKIE, SESSION_S, Guard
from .history import level, levels

log = logging.getLogger("scheduler.console")
HERE = Path(__file__).parent
Handler = Callable[[Request], Awaitable[Response]]


def iso(ms: int | None) -> str:
    return "" if ms is None else from_ms(ms).isoformat(timespec="seconds")


def build(client: Client, fleet: pages.Fleet, guard: Guard) -> Starlette:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters.update(iso=iso, ranges=shard_ranges, level=level, levels=levels)
    clock = client.clock

    def render(request: Request, name: str, status: int = 200, **ctx: Any) -> Response:
        cookie = request.cookies.get(COOKIE)
        who = guard.who(cookie, clock.now_ms() / 1000)
        ctx.update(who=who, csrf=guard.csrf(cookie) if who and cookie else "",
                   actions=guard.allow_actions, done=request.query_params.get("done", ""))
        return templates.TemplateResponse(request, name, ctx, status_code=status)

    def page(name: str, work: Callable[[Request], Any]) -> Handler:
        """A read-only page: ``work`` (run in a thread) returns the template's context."""
        async def endpoint(request: Request) -> Response:
            try:
                ctx = await run_in_threadpool(work, request)
            except (InvalidInput, ValueError) as exc:
                return render(request, "error.html", 400, error=str(exc), back=request.url.path)
            except (JobNotFound, ScheduleNotFound) as exc:
                return render(request, "error.html", 404, error=str(exc), back=request.url.path)
            except SchedulerError as exc:
                return render(request, "error.html", 503, error=str(exc), back=request.url.path)
            return render(request, name, **ctx)
        return endpoint

    def action(name: str, work: Callable[[Any, str], tuple[str, str]]) -> Handler:
        """A POST action: refused (403) unless actions are on and the session and CSRF
        token check out. ``work(form, who)`` returns (where to go, what was done)."""
        async def endpoint(request: Request) -> Response:
            form = await request.form()
            if not guard.allow_actions:
                return render(request, "error.html", 403, back="/fleet", error=(
                    "actions are off: start the console with --allow-actions and SCHEDULER_CONSOLE_TOKEN"))
            now_s = clock.now_ms() / 1000
            who = (guard.bearer(request.headers.get("authorization"), request.headers.get("x-scheduler-user"))
                   or guard.check(request.cookies.get(COOKIE), str(form.get("csrf", "")), now_s))
            if who is None:
                log.warning("console action refused: no valid session or CSRF token",
                            extra={"action": f"console_{name}_refused", "client": _peer(request)})
                return render(request, "error.html", 403, back="/login",
                              error="sign in with the console token first (your session or form expired)")
            try:
                where, done = await run_in_threadpool(work, form, who)
            except (InvalidInput, JobNotFound, ScheduleNotFound, ValueError) as exc:
                return render(request, "error.html", 400, error=str(exc), back="/fleet")
            except SchedulerError as exc:
                return render(request, "error.html", 503, error=str(exc), back="/fleet")
            log.info("console %s by %s: %s", name, who, done,
                     extra={"action": f"console_{name}", "who": who, "client": _peer(request)})
            sep = "&" if "?" in where else "?"
            return RedirectResponse(f"{where}{sep}{urlencode({'done': done})}", status_code=303)
        return endpoint

    # --- pages -------------------------------------------------------------------------

    def fleet_ctx(request: Request) -> dict[str, Any]:
        return {"view": fleet.snapshot(), "heat": fleet.heatmap(), "step_s": fleet.history.step_s}

    def bucket_ctx(request: Request) -> dict[str, Any]:
        q = request.query_params
        at = q.get("at", "")
        if not at:
            return {"data": None, "at": "", "shard": 0}
        shard = int(q.get("shard", "0") or 0)
        return {"data": pages.bucket_page(client, at, shard, q.get("after")), "at": at, "shard": shard}

    def job_ctx(request: Request) -> dict[str, Any]:
        job_id = request.query_params.get("id", "")
        if not job_id.strip():
            return {"data": None, "id": ""}
        return {"data": pages.job_page(client, job_id, clock.now_ms()), "id": job_id}

    def schedules_ctx(request: Request) -> dict[str, Any]:
        return pages.schedules_page(client, request.query_params.get("after"))

    def dead_ctx(request: Request) -> dict[str, Any]:
        q = request.query_params
        kind, error = q.get("kind", ""), q.get("error", "")
        return {**pages.dead_page(client, kind, error, q.get("after")), "kind": kind, "error": error}

    def audit_ctx(request: Request) -> dict[str, Any]:
        q = request.query_params
        first, last = pages.window(q.get("from", ""), q.get("to", ""), clock.now_ms())
        ctx: dict[str, Any] = {"from": iso(first), "to": iso(last), "report": None}
        if q.get("run"):
            report, took = pages.audit_page(client, first, last)
            ctx.update(report=report, totals=report.totals(), took_s=took)
        return ctx

    # --- actions -----------------------------------------------------------------------

    def replay(form: Any, who: str) -> tuple[str, str]:
        ids = [str(v) for v in form.getlist("job_id")]
        if not ids:
            raise InvalidInput("tick the dead letters to replay")
        jobs = client.replay_dead(ids)
        return "/dead", f"replayed {len(jobs)} jobs: {', '.join(j.job_id for j in jobs)[:200]}"

    def cancel(form: Any, who: str) -> tuple[str, str]:
        job_id = str(form.get("job_id", ""))
        done = client.cancel(job_id)
        what = f"cancelled {job_id}" if done else f"{job_id} was not pending"
        return f"/jobs?{urlencode({'id': job_id})}", what

    def pause_resume(verb: str) -> Callable[[Any, str], tuple[str, str]]:
        def work(form: Any, who: str) -> tuple[str, str]:
            sid = str(form.get("schedule_id", ""))
            getattr(client.recurring, verb)(sid)
            return "/schedules", f"{verb}d {sid}"
        return work

    def refire(form: Any, who: str) -> tuple[str, str]:
        first, last = pages.window(str(form.get("from", "")), str(form.get("to", "")), clock.now_ms())
        kind = str(form.get("kind", "")) or None
        found = rf.fired_in_window(client.store, first, last, kind)
        specs = rf.specs(found, (first, last))
        if specs:
            client.schedule_many(specs)
        counts = ", ".join(f"{k} {n}" for k, n in rf.counts_by_kind(found).items()) or "none"
        return "/audit", f"re-fired {len(specs)} jobs fired {iso(first)} to {iso(last)}: {counts}"

    # --- sign-in ------------------------------------------------------------------------

    async def login_page(request: Request) -> Response:
        return render(request, "login.html")

    async def login(request: Request) -> Response:
        form = await request.form()
        cookie = guard.login(str(form.get("token", "")), str(form.get("who", "")), clock.now_ms() / 1000)
        if cookie is None:
            log.warning("console sign-in refused", extra={"action": "console_login_refused",
                                                          "client": _peer(request)})
            return render(request, "login.html", 403, error=(
                "refused: actions are off, or the token is wrong, or the name is not 1-64 "
                "letters, digits or ._@-" if guard.allow_actions else
                "actions are off: start the console with --allow-actions and SCHEDULER_CONSOLE_TOKEN"))
        who = str(form.get("who"))
        log.info("console sign-in by %s", who, extra={"action": "console_login", "who": who,
                                                     "client": _peer(request)})
        response = RedirectResponse("/fleet", status_code=303)
        # Secure when served over TLS: the browser then never sends it in the clear.
        response.set_cookie(COOKIE, cookie, max_age=SESSION_S, httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return response

    async def logout(request: Request) -> Response:
        response = RedirectResponse("/fleet", status_code=303)
        response.delete_cookie(COOKIE)
        return response

    async def home(request: Request) -> Response:
        return RedirectResponse("/fleet", status_code=307)

    routes = [
        Route("/", home),
        Route("/fleet", page("fleet.html", fleet_ctx)),
        Route("/fleet/live", page("fleet_live.html", fleet_ctx)),
        Route("/buckets", page("bucket.html", bucket_ctx)),
        Route("/jobs", page("job.html", job_ctx)),
        Route("/schedules", page("schedules.html", schedules_ctx)),
        Route("/dead", page("dead.html", dead_ctx)),
        Route("/audit", page("audit.html", audit_ctx)),
        Route("/login", login_page),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/dead/replay", action("replay", replay), methods=["POST"]),
        Route("/jobs/cancel", action("cancel", cancel), methods=["POST"]),
        Route("/schedules/pause", action("pause", pause_resume("pause")), methods=["POST"]),
        Route("/schedules/resume", action("resume", pause_resume("resume")), methods=["POST"]),
        Route("/refire", action("refire", refire), methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    return Starlette(routes=routes)


def _peer(request: Request) -> str:
    return request.client.host if request.client else "?"
