"""The console's routes (Starlette). Reads go through ``pages``; actions need
``--allow-actions``, a signed-in session and the form's CSRF token (``guard``), ask the
browser to confirm when they destroy or send (``static/console.js`` reads the question
from the form's ``data-confirm``: pages hold no inline script), and are logged with
``action=`` and who. Every response carries the headers of ``protect``.

An action checks the caller's session (or bearer token) before it reads the body, then
parses the form with small limits. Errors become a page with one line: 400 for bad
input, 404 for an unknown job, 403 for a refused action, 413 for a form too large, 503
when the store cannot be read. Nothing is written on any of them.
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

from ..domain.flow import format_rate
from ..domain.keys import from_ms
from ..errors import InvalidInput, JobNotFound, ScheduleNotFound, SchedulerError
from ..observe import refire as rf
from ..observe.audit import audit
from ..observe.lag import shard_ranges
from ..producer.client import Client
from . import pages
from .auditrun import AuditRuns
from .guard import COOKIE, SESSION_S, Guard
from .history import level, levels
from .protect import FormRefused, LoopbackHosts, SecurityHeaders, banner, read_form

log = logging.getLogger("scheduler.console")
HERE = Path(__file__).parent
Handler = Callable[[Request], Awaitable[Response]]
Done = tuple[str, str, int | None, str]  # where to go, banner code, its count, what was done (for the log)


def iso(ms: int | None) -> str:
    return "" if ms is None else from_ms(ms).isoformat(timespec="seconds")


def build(client: Client, fleet: pages.Fleet, guard: Guard, audits: AuditRuns | None = None,
          loopback_hosts: bool = False) -> Starlette:
    """The console's ASGI app. ``audits`` gates and keeps the audit runs (default: one
    over ``client``'s store, anonymous runs at most once a minute). ``loopback_hosts``
    (for a console bound to a loopback address): answer 400 to any ``Host`` but
    localhost, 127.x.x.x or [::1]; off, a proxy in front decides which names reach it."""
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters.update(iso=iso, ranges=shard_ranges, level=level, levels=levels, rate=format_rate)
    clock = client.clock
    runs = audits or AuditRuns(lambda first, last: audit(client.store, first, last))

    def caller(request: Request) -> str | None:
        """Who is asking: a script's bearer token, else a live session; None: nobody."""
        return (guard.bearer(request.headers.get("authorization"), request.headers.get("x-scheduler-user"))
                or guard.who(request.cookies.get(COOKIE), clock.now_ms() / 1000))

    def render(request: Request, name: str, status: int = 200, **ctx: Any) -> Response:
        cookie = request.cookies.get(COOKIE)
        who = guard.who(cookie, clock.now_ms() / 1000)
        q = request.query_params
        ctx.update(who=who, csrf=guard.csrf(cookie) if who and cookie else "",
                   actions=guard.allow_actions, done=banner(q.get("done"), q.get("n")))
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

    def refused(request: Request, name: str) -> Response:
        log.warning("console action refused: no valid session or CSRF token",
                    extra={"action": f"console_{name}_refused", "client": _peer(request)})
        return render(request, "error.html", 403, back="/login",
                      error="sign in with the console token first (your session or form expired)")

    def action(name: str, work: Callable[[Any, str], Done]) -> Handler:
        """A POST action: refused (403) unless actions are on and the caller holds the
        bearer token or a live session, checked before the body is read; then the form
        is read with small limits and a session's form must carry its CSRF token.
        ``work(form, who)`` returns (where to go, banner code, count, what was done)."""
        async def endpoint(request: Request) -> Response:
            if not guard.allow_actions:
                return render(request, "error.html", 403, back="/fleet", error=(
                    "actions are off: start the console with --allow-actions and SCHEDULER_CONSOLE_TOKEN"))
            cookie = request.cookies.get(COOKIE)
            now_s = clock.now_ms() / 1000
            bearer = guard.bearer(request.headers.get("authorization"),
                                  request.headers.get("x-scheduler-user"))
            if bearer is None and guard.who(cookie, now_s) is None:
                return refused(request, name)
            try:
                form = await read_form(request)
            except FormRefused as exc:
                return render(request, "error.html", exc.status, error=str(exc), back="/fleet")
            who = bearer or guard.check(cookie, str(form.get("csrf", "")), now_s)
            if who is None:
                return refused(request, name)
            try:
                where, code, count, done = await run_in_threadpool(work, form, who)
            except (InvalidInput, JobNotFound, ScheduleNotFound, ValueError) as exc:
                return render(request, "error.html", 400, error=str(exc), back="/fleet")
            except SchedulerError as exc:
                return render(request, "error.html", 503, error=str(exc), back="/fleet")
            log.info("console %s by %s: %s", name, who, done,
                     extra={"action": f"console_{name}", "who": who, "client": _peer(request)})
            sep = "&" if "?" in where else "?"
            query = {"done": code} if count is None else {"done": code, "n": count}
            return RedirectResponse(f"{where}{sep}{urlencode(query)}", status_code=303)
        return endpoint

    # --- pages -------------------------------------------------------------------------

    def fleet_ctx(request: Request) -> dict[str, Any]:
        return {"view": fleet.snapshot(), "heat": fleet.heatmap(), "step_s": fleet.history.step_s}

    def bucket_ctx(request: Request) -> dict[str, Any]:
        q = request.query_params
        at = q.get("at", "")
        if not at:
            return {"data": None, "at": "", "shard": 0}
        shard = pages.int_param("shard", q.get("shard", "0") or "0", 0, 2**31 - 1)
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

    def limits_ctx(request: Request) -> dict[str, Any]:
        return pages.limits_page(client)

    def audit_ctx(request: Request) -> dict[str, Any]:
        q = request.query_params
        first, last = pages.window(q.get("from", ""), q.get("to", ""), clock.now_ms())
        note = runs.run(first, last, caller(request)) if q.get("run") else None
        shown = runs.last
        return {"from": iso(first), "to": iso(last), "note": note, "last": shown,
                "report": shown.report if shown else None,
                "totals": shown.report.totals() if shown else {}}

    # --- actions -----------------------------------------------------------------------

    def replay(form: Any, who: str) -> Done:
        ids = [str(v) for v in form.getlist("job_id")]
        if not ids:
            raise InvalidInput("tick the dead letters to replay")
        jobs = client.replay_dead(ids)
        return "/dead", "replayed", len(jobs), f"replayed {len(jobs)} jobs: {[j.job_id for j in jobs]!r:.300}"

    def cancel(form: Any, who: str) -> Done:
        job_id = str(form.get("job_id", ""))
        done = client.cancel(job_id)
        where = f"/jobs?{urlencode({'id': job_id})}"
        return (where, "cancelled", None, f"cancelled {job_id!r}") if done else \
            (where, "not-pending", None, f"{job_id!r} was not pending")

    def pause_resume(verb: str) -> Callable[[Any, str], Done]:
        def work(form: Any, who: str) -> Done:
            sid = str(form.get("schedule_id", ""))
            getattr(client.recurring, verb)(sid)
            return "/schedules", f"{verb}d", None, f"{verb}d {sid!r}"
        return work

    def refire(form: Any, who: str) -> Done:
        now = clock.now_ms()
        first, last = pages.window(str(form.get("from", "")), str(form.get("to", "")), now)
        rf.check_window(first, last, now)  # as the CLI: an end in the future would fire then, not at once
        kind = str(form.get("kind", "")) or None
        found = rf.fired_in_window(client.store, first, last, kind)
        specs = rf.specs(found, (first, last))
        if specs:
            client.schedule_many(specs)
        counts = ", ".join(f"{k} {n}" for k, n in rf.counts_by_kind(found).items()) or "none"
        what = f"re-fired {len(specs)} jobs fired {iso(first)} to {iso(last)}: {counts}"
        return "/audit", "refired", len(specs), what

    # --- sign-in ------------------------------------------------------------------------

    async def login_page(request: Request) -> Response:
        return render(request, "login.html")

    async def login(request: Request) -> Response:
        if not guard.allow_actions:
            return render(request, "login.html", 403, error=(
                "actions are off: start the console with --allow-actions and SCHEDULER_CONSOLE_TOKEN"))
        try:
            form = await read_form(request)
        except FormRefused as exc:
            return render(request, "login.html", exc.status, error=str(exc))
        cookie = guard.login(str(form.get("token", "")), str(form.get("who", "")), clock.now_ms() / 1000)
        if cookie is None:
            log.warning("console sign-in refused", extra={"action": "console_login_refused",
                                                          "client": _peer(request)})
            return render(request, "login.html", 403, error=(
                "refused: the token is wrong, or the name is not 1-64 letters, digits or ._@-"))
        who = str(form.get("who"))
        log.info("console sign-in by %s", who, extra={"action": "console_login", "who": who,
                                                     "client": _peer(request)})
        response = RedirectResponse("/fleet", status_code=303)
        # Secure when served over TLS: the browser then never sends it in the clear.
        response.set_cookie(COOKIE, cookie, max_age=SESSION_S, httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return response

    async def logout(request: Request) -> Response:
        """Ends the session on the server too: the cookie, even if copied, is dead."""
        who = guard.logout(request.cookies.get(COOKIE))
        if who is not None:
            log.info("console sign-out by %s", who, extra={"action": "console_logout", "who": who,
                                                          "client": _peer(request)})
        response = RedirectResponse("/fleet?done=signed-out", status_code=303)
        response.delete_cookie(COOKIE, httponly=True, samesite="strict", secure=request.url.scheme == "https")
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
        Route("/limits", page("limits.html", limits_ctx)),
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
    app = Starlette(routes=routes)
    if loopback_hosts:
        app.add_middleware(LoopbackHosts)
    app.add_middleware(SecurityHeaders)  # added last, so outermost: on the 400 of a bad Host too
    return app


def _peer(request: Request) -> str:
    return request.client.host if request.client else "?"
