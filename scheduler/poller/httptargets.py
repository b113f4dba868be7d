"""The built-in handler of the kind ``http``: a coroutine on the poller's event loop that
calls the job's URL with one shared ``httpx.AsyncClient`` (at most ``max_connections``
connections), so a thousand slow endpoints hold a thousand sockets, not threads.

**The guard at connect time.** Every new connection goes through ``GuardedBackend``: it
resolves the host itself, checks every address the name resolves to
(``netguard.guard``), and connects to a checked address, keeping the name for the
``Host`` header and for TLS (SNI and the certificate's check). A name that resolves to a
public address when the job is scheduled and to a private one when it runs (DNS
rebinding) is refused, because the socket goes to the very address that was checked.
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
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable
from ipaddress import ip_address
from typing import Any

import httpcore
import httpx

from ..domain.clock import Clock
from ..domain.httpoutcome import classify, code_class, printable
from ..domain.httptarget import parse_target, request_headers, sign
from ..domain.model import Job
from ..domain.netguard import Address, AllowList, guard, parse_host
from ..errors import GiveUp, InvalidInput, RetryLater
from ..observe.metrics import PollerMetrics

Resolver = Callable[[str, int], Awaitable[list[Address]]]
# Bytes of a response body read at most (so that its connection can be used again);
# past that the connection is closed instead. Only the first 200 are ever kept.
DRAIN_BYTES = 64 * 1024
KEEPALIVE_S = 5.0


class TargetRefused(GiveUp):
    """The guard refused every way to the target: the message names the address and why."""


async def system_resolve(host: str, port: int) -> list[Address]:
    """Every address ``host`` resolves to (the system's resolver, off the loop's thread),
    in its order, each once. ``httpcore.ConnectError`` when it does not resolve."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise httpcore.ConnectError(f"cannot resolve {host}: {why}") from None
    out: list[Address] = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            addr = ip_address(sockaddr[0])
            if addr not in out:
                out.append(addr)
    return out


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend with the guard in front of every connection (see the
    module). ``resolve`` may be replaced (tests point names at the loopback with it)."""

    def __init__(self, allow: AllowList, resolve: Resolver = system_resolve) -> None:
        self.allow = allow
        self.resolve = resolve
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        try:
            name, literal = parse_host(host)
        except InvalidInput as exc:
            raise TargetRefused(f"http target refused: {exc}") from None
        addresses = [literal] if literal is not None else await self.resolve(name, port)
        if not addresses:
            raise httpcore.ConnectError(f"{name} resolves to no address")
        for addr in addresses:
            why = guard(name, port, addr, self.allow)
            if why is not None:
                raise TargetRefused(f"http target {name}:{port} refused: {why} (an address off the public "
                                    "Internet; list it in SCHEDULER_HTTP_ALLOW if the target is meant)")
        failure: Exception | None = None
        for addr in addresses:  # each one checked above: none but these is ever connected to
            try:
                return await self._inner.connect_tcp(str(addr), port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, OSError) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        raise TargetRefused("http target refused: a Unix socket is never a target")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _Transport(httpx.AsyncHTTPTransport):
    """httpx's transport over a connection pool whose connections all go through the
    guard. (httpx has no argument for a network backend: its pool is replaced.)"""

    def __init__(self, backend: GuardedBackend, max_connections: int, tls: ssl.SSLContext) -> None:
        super().__init__(verify=tls, trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=tls, max_connections=max_connections, max_keepalive_connections=max_connections,
            keepalive_expiry=KEEPALIVE_S, network_backend=backend)


class HttpTargets:
    """The handler of the kind ``http`` for one poller. Its client is made on first use
    on the poller's event loop (``loop``), and closed by ``aclose`` when the loop ends; a
    call from another loop (``Poller.fire``, in the caller's thread) gets a client of its
    own, closed after the call. ``secret``: the signing secret (None: every attempt fails,
    saying how to set one)."""

    def __init__(self, *, allow: AllowList, secret: bytes | None, metrics: PollerMetrics, clock: Clock,
                 timeout_s: float, max_connections: int, tls: ssl.SSLContext | None = None,
                 resolve: Resolver = system_resolve) -> None:
        self.secret, self.metrics, self.clock = secret, metrics, clock
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.tls = tls
        self.backend = GuardedBackend(allow, resolve)
        self._client: httpx.AsyncClient | None = None
        # The poller's event loop, which owns the shared client (set by the worker that
        # runs this handler, before the loop starts).
        self.loop: asyncio.AbstractEventLoop | None = None

    def _new_client(self) -> httpx.AsyncClient:
        tls = self.tls or httpx.create_ssl_context(trust_env=False)
        return httpx.AsyncClient(transport=_Transport(self.backend, self.max_connections, tls),
                                 timeout=httpx.Timeout(self.timeout_s), follow_redirects=False,
                                 trust_env=False)

    async def __call__(self, job: Job) -> None:
        # The one place where headers beyond the payload's join a request: a trace's
        # ``traceparent`` goes in ``extra_headers`` here.
        await self.deliver(job, extra_headers=())

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
        headers = request_headers(target, job.job_id, job.attempt, signature, extra_headers)
        own = asyncio.get_running_loop() is self.loop
        if own and self._client is None:
            self._client = self._new_client()
        client = self._client if own and self._client is not None else self._new_client()
        where = f"{target.host}:{target.port}"
        status: int | None = None
        started = time.perf_counter()
        try:
            async with client.stream(target.method, target.url, headers=headers, content=target.body) as resp:
                status, retry_after = resp.status_code, resp.headers.get("retry-after")
                head = await _read_head(resp)
        except httpx.TimeoutException as exc:
            raise RetryLater(f"{type(exc).__name__}: no answer from {where} within "
                             f"{self.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            detail = printable(str(exc))[:300] or "no detail"
            raise RetryLater(f"{type(exc).__name__}: {where}: {detail}") from None
        finally:
            self.metrics.http_seconds.observe(time.perf_counter() - started)
            self.metrics.http_requests.labels(code_class(status)).inc()
            if client is not self._client:
                await client.aclose()
        verdict = classify(status, retry_after, head, self.clock.now_ms() / 1000, where)
        if verdict.fired:
            return
        if verdict.dead:
            raise GiveUp(verdict.error)
        raise RetryLater(verdict.error, delay_s=verdict.not_before_s)

    async def aclose(self) -> None:
        """Close the shared client and its connections; never raises."""
        client, self._client = self._client, None
        if client is not None:
            # Closing the sockets of a loop that is ending: nothing to save on failure.
            with contextlib.suppress(Exception):
                await client.aclose()


async def _read_head(resp: httpx.Response) -> bytes:
    """The first bytes of a response body (what an error shows), read raw (never
    inflated) and drained up to ``DRAIN_BYTES`` so that the connection can serve again."""
    head = b""
    total = 0
    async for chunk in resp.aiter_raw():
        if len(head) < 200:
            head += chunk[:200 - len(head)]
        total += len(chunk)
        if total > DRAIN_BYTES:
            break
    return head
