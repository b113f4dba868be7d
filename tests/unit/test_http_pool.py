"""The connection pool of HTTP targets (``scheduler.poller.httppool``) against local
servers: connections kept alive and reused, never more open than the bound, a kept-alive
connection the server closed replaced without a failure, bodies drained up to a bound,
responses framed every way HTTP/1.1 allows, and broken ones failing as httpx's errors."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from ipaddress import ip_address
from typing import Any

import httpx
import pytest

from bench.receiver import Receiver, Reply
from scheduler.domain.clock import SystemClock
from scheduler.domain.model import Job
from scheduler.domain.netguard import parse_allow
from scheduler.errors import RetryLater
from scheduler.observe.metrics import PollerMetrics
from scheduler.poller.httppool import CLOSED_EARLY, Connector, Pool, TargetRefused
from scheduler.poller.httptargets import HttpTargets

ALLOW = parse_allow("127.0.0.0/8")


def pool(max_connections: int = 8) -> Pool:
    return Pool(Connector(ALLOW), max_connections)


async def get(p: Pool, port: int, path: str = "/", method: str = "POST", body: bytes = b"x") -> Any:
    url = httpx.URL(f"http://127.0.0.1:{port}{path}")
    headers = [("Host", f"127.0.0.1:{port}")] + ([("Content-Length", str(len(body)))] if body else [])
    return await p.request(method, url, headers, body, keep=200, most=64 * 1024)


def test_sequential_requests_share_one_kept_alive_connection():
    async def main(port: int) -> None:
        p = pool()
        for _ in range(5):
            reply = await get(p, port)
            assert (reply.status, reply.head) == (200, b"ok")
        reply = await get(p, port, method="HEAD", body=b"")
        assert reply.status == 200 and reply.head == b""
        await p.aclose()

    with Receiver() as rx:
        asyncio.run(main(rx.port))
    assert rx.accepted == 1 and len(rx.requests) == 6


def test_no_more_connections_than_the_bound_however_many_requests_wait():
    async def main(port: int) -> None:
        p = pool(max_connections=4)
        replies = await asyncio.gather(*(get(p, port, f"/{i}") for i in range(40)))
        assert all(r.status == 200 for r in replies)
        await p.aclose()

    with Receiver(lambda req: Reply(delay_s=0.05)) as rx:
        asyncio.run(main(rx.port))
    assert rx.accepted == 4 and rx.most_in_flight == 4 and len(rx.requests) == 40


def test_a_cancelled_request_frees_its_connection():
    async def main(port: int) -> None:
        p = pool(max_connections=1)
        slow = asyncio.ensure_future(get(p, port, "/slow"))
        waiting = asyncio.ensure_future(get(p, port, "/next"))
        await asyncio.sleep(0.2)
        slow.cancel()
        assert (await waiting).status == 200
        await p.aclose()

    with Receiver(lambda req: Reply(delay_s=30 if req.target == "/slow" else 0)) as rx:
        asyncio.run(asyncio.wait_for(main(rx.port), 10))


Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def raw_server(serve: Serve, test: Callable[[int], Awaitable[None]]) -> None:
    """Run ``test(port)`` against a server answering with ``serve`` per connection."""
    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        try:
            await test(server.sockets[0].getsockname()[1])
        finally:
            server.close()
    asyncio.run(asyncio.wait_for(main(), 20))


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    lengths = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
               if line.lower().startswith(b"content-length")]
    size = lengths[0] if lengths else 0
    return head + await reader.readexactly(size)


def test_a_kept_alive_connection_the_server_closed_is_replaced_without_a_failure():
    """The server answers a connection's first request, then drops it on the next one
    without a word (an idle timeout racing the request): the request goes again, once,
    on a new connection."""
    connections = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await read_request(reader)
        writer.close()

    async def test(port: int) -> None:
        p = pool()
        assert (await get(p, port)).status == 200
        assert (await get(p, port)).status == 200
        await p.aclose()

    raw_server(serve, test)
    assert len(connections) == 2


@pytest.mark.parametrize("response,head", [
    (b"HTTP/1.1 500 X\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", b"abcde"),
    (b"HTTP/1.1 404 X\r\nConnection: close\r\n\r\nuntil the end", b"until the end"),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 X\r\nContent-Length: 1\r\n\r\nz", b"z"),
    (b"HTTP/1.0 200 X\r\n\r\nold", b"old"),
])
def test_responses_framed_every_way(response, head):
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(response)
        await writer.drain()
        writer.close()

    async def test(port: int) -> None:
        p = pool()
        reply = await get(p, port)
        assert reply.head == head
        await p.aclose()

    raw_server(serve, test)


def test_a_long_body_is_drained_up_to_its_bound_and_only_its_start_kept():
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 502 X\r\nContent-Length: 10000000\r\n\r\n" + b"y" * 200_000)
        await writer.drain()
        await asyncio.sleep(5)  # the rest never comes: the client must not wait for it

    async def test(port: int) -> None:
        p = pool()
        reply = await asyncio.wait_for(get(p, port), 3)
        assert reply.status == 502 and reply.head == b"y" * 200
        await p.aclose()

    raw_server(serve, test)


@pytest.mark.parametrize("response,error", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", httpx.RemoteProtocolError),
    (b"garbage\r\n\r\n", httpx.RemoteProtocolError),
    (b"", httpx.RemoteProtocolError),
    (b"HTTP/1.1 200 OK\r\n" + b"X-Long: " + b"a" * 70_000 + b"\r\n\r\n", httpx.RemoteProtocolError),
])
def test_a_broken_response_fails_as_an_httpx_error(response, error):
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(response)
        await writer.drain()
        writer.close()

    async def test(port: int) -> None:
        p = pool()
        with pytest.raises(error):
            await get(p, port)
        await p.aclose()

    raw_server(serve, test)



@pytest.mark.parametrize("response", [b"", b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 200 OK\r\nCont"])
def test_a_server_closing_before_a_full_response_is_one_plain_line(response):
    """Not h11's "can't handle event type ConnectionClosed when role=SERVER...": the job's
    error says what happened, and it is retried (an httpx transport error)."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(response)
        await writer.drain()
        writer.close()

    async def test(port: int) -> None:
        p = pool()
        with pytest.raises(httpx.RemoteProtocolError) as err:
            await get(p, port)
        assert str(err.value) == CLOSED_EARLY == "the server closed the connection before a full response"
        await p.aclose()
        targets = HttpTargets(allow=ALLOW, secret=b"s" * 32, metrics=PollerMetrics(), clock=SystemClock(),
                              timeout_s=5, max_connections=1)
        job = Job("j", "http", b'{"url": "http://127.0.0.1:%d/"}' % port, True, 0, 0, 0, 0)
        with pytest.raises(RetryLater) as retry:
            await targets.deliver(job)
        assert str(retry.value) == f"RemoteProtocolError: 127.0.0.1:{port}: {CLOSED_EARLY}"

    raw_server(serve, test)


def test_a_refused_port_is_a_connect_error_and_a_refused_address_never_connects():
    async def main() -> None:
        p = pool()
        with pytest.raises(httpx.ConnectError):
            await get(p, 1)
        strict = Pool(Connector(parse_allow("")), 2)
        with pytest.raises(TargetRefused, match=r"127\.0\.0\.1 \(loopback\) is refused"):
            await get(strict, 1)
        assert strict._open == 0 and p._open == 0

    asyncio.run(main())



def test_an_idn_host_is_resolved_checked_and_connected_to_by_its_ascii_name():
    """httpx decodes an xn-- host to Unicode (``URL.host``); the guard takes only the
    ASCII form, which the producer accepted: the pool must hand it that one."""
    asked: list[str] = []

    async def loopback(host: str, port: int) -> list[Any]:
        asked.append(host)
        return [ip_address("127.0.0.1")]

    async def main(port: int) -> None:
        p = Pool(Connector(ALLOW, resolve=loopback), 2)
        url = httpx.URL(f"http://xn--bcher-kva.example:{port}/")
        headers = [("Host", url.netloc.decode("ascii")), ("Content-Length", "1")]
        reply = await p.request("POST", url, headers, b"x", keep=200, most=64 * 1024)
        assert reply.status == 200
        await p.aclose()

    with Receiver() as rx:
        asyncio.run(main(rx.port))
    assert asked == ["xn--bcher-kva.example"] and len(rx.requests) == 1



def test_the_connector_checks_an_idn_given_in_unicode_by_its_ascii_name():
    asked: list[str] = []

    async def loopback(host: str, port: int) -> list[Any]:
        asked.append(host)
        return [ip_address("127.0.0.1")]

    async def main(port: int) -> None:
        connector = Connector(ALLOW, resolve=loopback)
        conn = await connector.connect("http", httpx.URL("http://xn--bcher-kva.example/").host, port)
        # Aborted only once the receiver has the connection: a reset before asyncio's
        # server accepts it leaks the accepted socket inside asyncio (3.11).
        for _ in range(1000):
            if rx.accepted:
                break
            await asyncio.sleep(0.01)
        conn.abort()

    with Receiver() as rx:
        asyncio.run(main(rx.port))
    assert asked == ["xn--bcher-kva.example"]



def test_an_ipv6_target_is_named_in_brackets_when_refused_or_unreachable():
    async def main() -> None:
        with pytest.raises(TargetRefused, match=r"^http target \[::1\]:1 refused: ::1 \(loopback\)"):
            await Connector(parse_allow("")).connect("http", "::1", 1)
        targets = HttpTargets(allow=parse_allow("::1"), secret=b"s" * 32, metrics=PollerMetrics(),
                              clock=SystemClock(), timeout_s=5, max_connections=1)
        job = Job("j", "http", b'{"url": "http://[::1]:1/"}', True, 0, 0, 0, 0)
        with pytest.raises(RetryLater, match=r"^ConnectError: \[::1\]:1: "):  # nothing listens on port 1
            await targets.deliver(job)

    asyncio.run(main())
