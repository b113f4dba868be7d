"""The connections of HTTP targets: the SSRF guard in front of every connection, and the
pool that keeps them.

**The guard at connect time** (``Connector``). It resolves the host itself, checks
every address the name resolves to (``netguard.guard``; one refused address refuses the
target), and connects to an address it checked, keeping the name for the ``Host``
header and for TLS (SNI and the certificate's check against the name). A name that
resolves to a public address when the job is scheduled and to a private one when it
runs (DNS rebinding) is refused, because the socket goes to the very address that was
checked.

**The pool** (``Pool``): HTTP/1.1 connections spoken with h11 (the parser under httpx)
on asyncio's streams, kept alive per origin in a stack: the top idle one serves the next
request. URLs, TLS contexts and errors are httpx's. Neither httpx's client nor its
default transport (httpcore, on anyio) carries the requests: the client's cookie jar
would hand one target's cookies to the requests of other jobs, and the two cost CPU the
poller's one event loop cannot spare. Measured on one core: 940 us of CPU per request
through ``httpx.AsyncClient``, 560 us through httpcore's transport alone, 180 us here;
with 100 connections httpcore's pool, which rescans every connection at every request,
held it to 58 requests/s. At most ``max_connections`` are open; a request beyond waits
for one. No timeout per read or write: the kind's ``timeout_s`` bounds the whole
request (the caller cancels it).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable
from ipaddress import ip_address
from typing import Any, NamedTuple

import h11
import httpx

from ..domain.netguard import Address, AllowList, guard, host_port, parse_host
from ..errors import GiveUp, InvalidInput

Resolver = Callable[[str, int], Awaitable[list[Address]]]
KEEPALIVE_S = 5.0
READ_BYTES = 65536
Key = tuple[str, str, int]
CLOSED_EARLY = "the server closed the connection before a full response"


class TargetRefused(GiveUp):
    """The guard refused the target: the message names the address and why."""


async def system_resolve(host: str, port: int) -> list[Address]:
    """Every address ``host`` resolves to (the system's resolver, off the loop's thread),
    in its order, each once. ``httpx.ConnectError`` when it does not resolve."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise httpx.ConnectError(f"cannot resolve {host}: {getattr(exc, 'strerror', None) or exc}") from None
    out: list[Address] = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            addr = ip_address(sockaddr[0])
            if addr not in out:
                out.append(addr)
    return out


class Connector:
    """Opens guarded connections (see the module). ``resolve`` may be replaced (tests
    point names at the loopback with it)."""

    def __init__(self, allow: AllowList, tls: ssl.SSLContext | None = None,
                 resolve: Resolver = system_resolve) -> None:
        """``tls``: the context of https connections (None: the system's CAs)."""
        self.allow, self.tls, self.resolve = allow, tls, resolve

    async def connect(self, scheme: str, host: str, port: int) -> Connection:
        """A connection to ``host`` (an IPv6 address without brackets; an IDN in either
        form, checked in its xn-- one): ``TargetRefused`` when the guard refuses it,
        ``httpx.ConnectError`` when no checked address can be reached."""
        if not host.isascii():  # an IDN as ``httpx.URL.host`` gives it: its xn-- form is checked
            with contextlib.suppress(httpx.InvalidURL, UnicodeError):
                host = httpx.URL(scheme="http", host=host).raw_host.decode("ascii")
        try:
            name, literal = parse_host(host)
        except InvalidInput as exc:
            raise TargetRefused(f"http target refused: {exc}") from None
        addresses = [literal] if literal is not None else await self.resolve(name, port)
        if not addresses:
            raise httpx.ConnectError(f"{name} resolves to no address")
        for addr in addresses:
            why = guard(name, port, addr, self.allow)
            if why is not None:
                where = host_port(name, port)
                raise TargetRefused(f"http target {where} refused: {why} (an address off the public "
                                    "Internet; list it in SCHEDULER_HTTP_ALLOW if the target is meant)")
        failure: OSError | None = None
        tls = None
        if scheme == "https":
            tls = self.tls = self.tls or ssl.create_default_context()
        for addr in addresses:  # each one checked above: none but these is ever connected to
            try:
                # A literal address: asyncio connects without resolving anything; TLS
                # names (and checks the certificate against) the host, not the address.
                reader, writer = await asyncio.open_connection(str(addr), port, ssl=tls, limit=READ_BYTES,
                                                               server_hostname=name if tls else None)
                return Connection(reader, writer)
            except OSError as exc:  # refused, unreachable, or TLS (ssl.SSLError is one)
                failure = exc
        raise httpx.ConnectError(str(failure) or type(failure).__name__)


class Connection:
    """One HTTP/1.1 connection: asyncio's streams and h11's state machine."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = time.monotonic()
        self.answered = False  # a byte of a response came: a failure is no stale keep-alive
        self.headed = False  # the final response's head came

    def reusable(self) -> bool:
        """Idle, not past its keep-alive, and not closed by the server meanwhile."""
        return (self.h11.our_state is h11.IDLE and time.monotonic() - self.idle_since < KEEPALIVE_S
                and not self.reader.at_eof() and not self.writer.is_closing()
                and not getattr(self.reader, "_buffer", b""))

    async def send(self, method: str, target: bytes, headers: list[tuple[str, str]],
                   body: bytes) -> h11.Response:
        """Send a request and read up to its response's head (past any 1xx)."""
        self.answered = self.headed = False
        data = self.h11.send(h11.Request(method=method, target=target, headers=headers)) or b""
        if body:
            data += self.h11.send(h11.Data(data=body)) or b""
        data += self.h11.send(h11.EndOfMessage()) or b""
        try:
            self.writer.write(data)
            await self.writer.drain()
        except OSError as exc:
            raise httpx.WriteError(str(exc) or type(exc).__name__) from None
        while True:
            event = await self.next_event()
            if isinstance(event, h11.Response):
                self.headed = True
                return event

    async def read_body(self, keep: int, most: int) -> bytes:
        """The first ``keep`` bytes of the response's body; the rest is read and dropped,
        up to ``most`` bytes (then the response is left unread: the connection closes)."""
        head, total = b"", 0
        while total <= most:
            event = await self.next_event()
            if isinstance(event, h11.EndOfMessage):
                break
            if isinstance(event, h11.Data):
                if len(head) < keep:
                    head += bytes(event.data[:keep - len(head)])
                total += len(event.data)
        return head

    async def next_event(self) -> Any:
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                # Closed before the head (nothing, a 1xx, part of the head): h11 words
                # that in its own terms ("can't handle event type ConnectionClosed when
                # role=SERVER..."), which tell a user nothing.
                if self.reader.at_eof() and not self.headed:
                    raise httpx.RemoteProtocolError(CLOSED_EARLY) from None
                raise httpx.RemoteProtocolError(f"the response breaks HTTP/1.1: {exc}") from None
            if event is not h11.NEED_DATA:
                if isinstance(event, h11.ConnectionClosed):
                    raise httpx.RemoteProtocolError(CLOSED_EARLY)
                return event
            try:
                data = await self.reader.read(READ_BYTES)
            except OSError as exc:
                raise httpx.ReadError(str(exc) or type(exc).__name__) from None
            self.answered = self.answered or bool(data)
            self.h11.receive_data(data)

    def done(self) -> bool:
        """After the response's end: whether the connection can serve again (then ready)."""
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            self.idle_since = time.monotonic()
            return True
        return False

    def abort(self) -> None:
        # Aborted, not closed: nothing is left to send, and a TLS close would wait for
        # the peer's reply, which may never come.
        self.writer.transport.abort()


class Reply(NamedTuple):
    status: int
    headers: list[tuple[bytes, bytes]]  # names lowercased
    head: bytes  # the first bytes of the body


class Pool:
    """Guarded connections, kept alive per origin (see the module)."""

    def __init__(self, connector: Connector, max_connections: int) -> None:
        self.connector, self._max = connector, max_connections
        self._idle: dict[Key, list[Connection]] = {}
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    async def request(self, method: str, url: httpx.URL, headers: list[tuple[str, str]], body: bytes, *,
                      keep: int, most: int) -> Reply:
        """Make one request: its status, headers and first ``keep`` bytes of body (up to
        ``most`` bytes are read so that the connection can serve again). Raises
        ``TargetRefused`` or one of httpx's errors (``ConnectError``, ``ReadError``...)."""
        # The host as sent (``raw_host``: an IDN in its xn-- form, as the producer checked
        # it); ``url.host`` is decoded to Unicode, which the guard rightly refuses.
        key = (url.scheme, url.raw_host.decode("ascii"), url.port or (443 if url.scheme == "https" else 80))
        retried = False
        while True:
            conn = await self._acquire(key)
            reused = conn is not None
            try:
                if conn is None:
                    conn = await self.connector.connect(*key)
                response = await conn.send(method, url.raw_path, headers, body)
                head = await conn.read_body(keep, most)
            except BaseException as exc:
                if conn is not None:
                    conn.abort()
                self._free()
                # A kept-alive connection the server closed meanwhile fails before any
                # answer: the request goes once more, on a new connection.
                if (reused and not retried and conn is not None and not conn.answered
                        and isinstance(exc, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError)):
                    retried = True
                    continue
                raise
            self._release(key, conn)
            return Reply(response.status_code, list(response.headers), head)

    async def _acquire(self, key: Key) -> Connection | None:
        """An idle connection to ``key``'s origin, or None with a slot taken for a new one."""
        while True:
            idle = self._idle.get(key)
            while idle:
                conn = idle.pop()
                if conn.reusable():
                    return conn
                conn.abort()
                self._open -= 1
            if self._open < self._max:
                self._open += 1
                return None
            other = next((conns for conns in self._idle.values() if conns), None)
            if other is not None:  # all open, one of them idle for another origin: replace it
                other.pop(0).abort()
                self._open -= 1
                continue
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:  # cancelled (the kind's timeout, a stop)
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, then cancelled: the next one in line gets the turn
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
                raise

    def _release(self, key: Key, conn: Connection) -> None:
        """Back to its origin's stack when it can serve again (its response read to the
        end, keep-alive), else closed."""
        if not self._closed and conn.done():
            self._idle.setdefault(key, []).append(conn)
            self._wake()
        else:
            conn.abort()
            self._free()

    def _free(self) -> None:
        self._open -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        """Close every idle connection; a busy one is closed when its request ends."""
        self._closed = True
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.abort()
                self._open -= 1
