"""The built-in handler of the kind ``http``: a coroutine on the poller's event loop that
calls the job's URL through one shared pool of connections (``httppool.Pool``, at most
``max_connections``), so a thousand slow endpoints hold a thousand sockets, not threads.

Every new connection goes through the SSRF guard (``httppool.Connector``): the name is
resolved here, every address checked, and a checked address connected to.
Redirects are not followed; proxies from the environment are not used (a proxy would
connect on our behalf, past the guard).

**Outcomes** (``httpoutcome.classify``): the handler returns on 2xx, raises ``GiveUp``
(dead at once) for a refused target, an invalid payload or a status that retrying cannot
mend, and ``RetryLater`` for the rest (5xx, 408, 429 with its ``Retry-After``, timeouts,
connection errors). The kind's ``timeout_s`` bounds each request; past it the poller
cancels the call as it does any async handler's ("timed out after N s", retried).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time

import h11
import httpx

from ..domain.clock import Clock
from ..domain.httpoutcome import ERROR_BODY_BYTES, classify, code_class, printable
from ..domain.httptarget import parse_target, request_headers, sign
from ..domain.model import Job
from ..domain.netguard import AllowList, host_port
from ..errors import GiveUp, InvalidInput, RetryLater
from ..observe.metrics import PollerMetrics
from ..observe.tracing import outgoing_traceparent
from .httppool import Connector, Pool, Resolver, system_resolve

# Bytes of a response body read at most (so that its connection can be used again);
# past that the connection is closed instead. Only the first 200 are ever kept.
DRAIN_BYTES = 64 * 1024
URL_CACHE = 1024


class HttpTargets:
    """The handler of the kind ``http`` for one poller. Its connection pool
    (``httppool.Pool``) is made on first use on the poller's event loop (``loop``) and
    closed by ``aclose`` when the loop ends; a call from another loop (``Poller.fire``,
    in the caller's thread) gets one of its own, closed after the call. ``secret``: the
    signing secret (None: every attempt fails, saying how to set one)."""

    def __init__(self, *, allow: AllowList, secret: bytes | None, metrics: PollerMetrics, clock: Clock,
                 timeout_s: float, max_connections: int, tls: ssl.SSLContext | None = None,
                 resolve: Resolver = system_resolve) -> None:
        self.secret, self.metrics, self.clock = secret, metrics, clock
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.tls = tls  # None: the system's CAs (certifi's), made on first use
        self.connector = Connector(allow, resolve=resolve)
        self._pool: Pool | None = None
        self._urls: dict[str, httpx.URL] = {}
        # The poller's event loop, which owns the shared pool (set by the worker that
        # runs this handler, before the loop starts).
        self.loop: asyncio.AbstractEventLoop | None = None

    def _url(self, text: str) -> httpx.URL:
        """``text`` parsed by httpx, once per distinct URL (jobs of one target share it)."""
        url = self._urls.get(text)
        if url is None:
            if len(self._urls) >= URL_CACHE:
                self._urls.clear()
            url = self._urls[text] = httpx.URL(text)
        return url

    def _new_pool(self) -> Pool:
        if self.tls is None:
            self.tls = httpx.create_ssl_context(trust_env=False)
        self.connector.tls = self.tls
        return Pool(self.connector, self.max_connections)

    async def __call__(self, job: Job) -> None:
        # The one place where headers beyond the payload's join a request: the attempt's
        # ``traceparent`` (its span's, else the one stored with the job); it replaces one
        # the payload may carry (``request_headers``).
        tp = outgoing_traceparent(job)
        await self.deliver(job, extra_headers=(("traceparent", tp),) if tp else ())

    async def deliver(self, job: Job, extra_headers: tuple[tuple[str, str], ...] = ()) -> None:
        """Make the job's request once. Returns when the target answered 2xx; raises
        ``GiveUp`` or ``RetryLater`` otherwise (see the module). Never logs the secret,
        the payload's headers or the URL's path and query."""
        try:
            target = parse_target(job.payload)
        except InvalidInput as exc:
            raise GiveUp(f"invalid http target: {exc}") from None
        if self.secret is None:
            raise RetryLater("no signing secret: set SCHEDULER_HTTP_SIGNING_SECRET_FILE on the pollers "
                             "(every request of an http job is signed)")
        signature = sign(self.secret, self.clock.now_ms() // 1000, target.body)
        try:
            url = self._url(target.url)
        except httpx.InvalidURL:  # the payload's checks should have refused it: no retry helps
            raise GiveUp("invalid http target: the url is not one the HTTP client can send; fix the "
                         "job's payload") from None
        headers = [("Host", url.netloc.decode("ascii")),
                   *request_headers(target, job.job_id, job.attempt, signature, extra_headers)]
        if target.body or target.method in ("POST", "PUT", "PATCH"):
            headers.append(("Content-Length", str(len(target.body))))
        own = asyncio.get_running_loop() is self.loop
        if own and self._pool is None:
            self._pool = self._new_pool()
        pool = self._pool if own and self._pool is not None else self._new_pool()
        where = host_port(target.host, target.port)
        status: int | None = None
        started = time.perf_counter()
        try:
            # The poller cancels a call past the kind's timeout; this bounds one that runs
            # in the caller's thread (``Poller.fire``), which nothing else would.
            async with asyncio.timeout(self.timeout_s):
                reply = await pool.request(target.method, url, headers, target.body, keep=ERROR_BODY_BYTES,
                                           most=DRAIN_BYTES)
            status = reply.status
        except TimeoutError:
            raise RetryLater(f"no answer from {where} within {self.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            detail = printable(str(exc))[:300] or "no detail"
            raise RetryLater(f"{type(exc).__name__}: {where}: {detail}") from None
        except h11.LocalProtocolError:
            # A request h11 will not write: no retry helps. Its text quotes the offending
            # header value, which may be a credential: never copied into the error.
            raise GiveUp(f"the request to {where} is not valid HTTP (a header or the method); "
                         "fix the job's payload") from None
        finally:
            self.metrics.http_seconds.observe(time.perf_counter() - started)
            self.metrics.http_requests.labels(code_class(status)).inc()
            if pool is not self._pool:
                await pool.aclose()
        retry_after = next((v.decode("latin-1") for k, v in reply.headers if k == b"retry-after"), None)
        verdict = classify(reply.status, retry_after, reply.head, self.clock.now_ms() / 1000, where)
        if verdict.fired:
            return
        if verdict.dead:
            raise GiveUp(verdict.error)
        raise RetryLater(verdict.error, delay_s=verdict.not_before_s)

    async def aclose(self) -> None:
        """Close the shared pool and its connections; never raises."""
        pool, self._pool = self._pool, None
        if pool is not None:
            # Closing the sockets of a loop that is ending: nothing to save on failure.
            with contextlib.suppress(Exception):
                await pool.aclose()
