"""What every response and every form goes through: security headers on each response,
bounded parsing of form bodies, and status banners from fixed codes only.

The headers: a Content-Security-Policy that lets scripts come only from the console's
own static files (no inline script or handler runs, even if a page ever echoed one),
no framing (clickjacking), no MIME sniffing, no referrer (page URLs hold job ids), and
``Cache-Control: no-store`` on everything but the static files (pages carry the CSRF
token of a session). A console bound to a loopback address answers only requests whose
``Host`` names the loopback (``LoopbackHosts``: no DNS rebinding).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.datastructures import FormData, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Awaitable[None]]

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
}

# A form is at most a page of ticked dead letters (100) and a few fields; ids are at most
# 256 bytes of UTF-8, three times that percent-encoded.
MAX_FIELDS = 120
MAX_PART_BYTES = 4096
MAX_BODY_BYTES = 64 * 1024


class SecurityHeaders:
    """ASGI middleware: ``HEADERS`` on every HTTP response, and ``no-store`` on every
    response outside ``/static/``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = str(scope.get("path", "")).startswith("/static/")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers[name] = value
                if not static:
                    headers["cache-control"] = "no-store"
            await send(message)

        await self.app(scope, receive, send_with_headers)


def local_host(value: str) -> bool:
    """Whether a ``Host`` header names this machine's loopback: ``localhost``, any
    ``127.x.x.x`` or ``[::1]``, with or without a port. Pure; False for anything else."""
    host, port = value.strip().lower(), ""
    if host.startswith("["):
        host, _, port = host[1:].partition("]")
        if port and not port.startswith(":"):
            return False
        port = port[1:]
        try:
            ok = ipaddress.IPv6Address(host) == ipaddress.IPv6Address("::1")
        except ValueError:
            return False
    else:
        if ":" in host:
            host, _, port = host.partition(":")
        try:
            ok = host == "localhost" or ipaddress.IPv4Address(host).is_loopback
        except ValueError:
            return False
    return ok and (port == "" or (port.isascii() and port.isdigit() and len(port) <= 5))


class LoopbackHosts:
    """ASGI middleware for a console bound to a loopback address: a request whose
    ``Host`` is not a loopback name gets 400. A web page the browser loaded from another
    site cannot then read the console by pointing its own name at 127.0.0.1 (DNS
    rebinding): the browser sends that name as the Host."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] == "http":
            hosts = [v for k, v in scope.get("headers", []) if k == b"host"]
            if len(hosts) != 1 or not local_host(hosts[0].decode("latin-1")):
                response = PlainTextResponse("bad Host header: this console answers only to localhost, "
                                             "127.0.0.1 or [::1]\n", status_code=400)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class FormRefused(Exception):
    """A form body the console does not parse: ``status`` (400 or 413) and why."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


class _TooLarge(Exception):
    pass


async def read_form(request: Request, max_body: int = MAX_BODY_BYTES) -> FormData:
    """The form of ``request``, parsed with small limits (no files, ``MAX_FIELDS`` fields
    of at most ``MAX_PART_BYTES``, a body of at most ``max_body`` bytes, counted as it
    arrives, so a missing or lying Content-Length does not help). Raises
    ``FormRefused`` (413 too large, 400 malformed); reads at most ``max_body`` + one
    chunk either way. Call it only after the caller's rights are checked."""
    length = request.headers.get("content-length")
    if length is not None:
        if not (length.isascii() and length.isdigit()):
            raise FormRefused(400, "the Content-Length header is not a number")
        if int(length) > max_body:
            raise FormRefused(413, f"the form is larger than {max_body // 1024} KB")
    seen = 0
    receive = request.receive

    async def capped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > max_body:
                raise _TooLarge
        return message

    try:
        return await Request(request.scope, capped).form(
            max_files=0, max_fields=MAX_FIELDS, max_part_size=MAX_PART_BYTES)
    except _TooLarge:
        raise FormRefused(413, f"the form is larger than {max_body // 1024} KB") from None
    except HTTPException as exc:  # starlette's MultiPartException, as a 400
        raise FormRefused(400, f"the form does not parse: {exc.detail}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormRefused(400, f"the form does not parse: {exc}") from None


# What an action's redirect may show: a code and at most one count. Any other ?done= shows
# nothing, so a crafted link cannot put its own words on a console page.
BANNERS = {
    "replayed": "Replayed {n} dead letters: they fire again now.",
    "cancelled": "Cancelled the job: it will not fire.",
    "not-pending": "The job was not pending: nothing changed.",
    "paused": "Paused the schedule.",
    "resumed": "Resumed the schedule.",
    "refired": "Re-fired {n} jobs.",
    "signed-out": "Signed out: that session is over.",
}


def banner(code: str | None, count: str | None) -> str:
    """The text for ``?done=code&n=count``: empty for an unknown code, or for a text
    that needs a count when ``count`` is not a number of at most 9 digits."""
    text = BANNERS.get(code or "")
    if text is None:
        return ""
    if "{n}" not in text:
        return text
    if not count or len(count) > 9 or not (count.isascii() and count.isdigit()):
        return ""
    return text.format(n=int(count))
