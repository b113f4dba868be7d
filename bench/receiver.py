"""A small HTTP/1.1 receiver on asyncio, for the ``http_targets`` benchmark and the tests
of HTTP targets: it records every request (arrival time, method, target, headers, body)
and answers as its ``respond`` function says, after that function's delay (a timer, not a
task), keeping connections alive. One thread (or one process: ``python -m
bench.receiver``) serves any number of slow requests at once.

    .venv/bin/python -m bench.receiver [--port 0] [--delay-ms 50] --out FILE

prints ``listening on PORT`` and, on SIGTERM or SIGINT, writes one ``job_id arrival_ms``
line per request to FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Request:
    arrival_ms: int
    method: str
    target: str
    headers: dict[str, str]  # names lowercased
    body: bytes
    server_name: str | None = None  # the TLS client's SNI, over TLS


@dataclass
class Reply:
    status: int = 200
    body: bytes = b"ok"
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


Respond = Callable[[Request], Reply]


class Receiver:
    """Serves on ``127.0.0.1``; ``start`` returns once it listens (``port``)."""

    def __init__(self, respond: Respond | None = None, tls: ssl.SSLContext | None = None) -> None:
        self.respond: Respond = respond or (lambda req: Reply())
        self.tls = tls
        self.requests: list[Request] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._sni: dict[int, str | None] = {}
        self.connections: set[_Connection] = set()
        self.accepted = 0  # connections accepted in all
        if tls is not None:
            tls.sni_callback = self._record_sni

    def _record_sni(self, sock: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> None:
        self._sni[id(sock)] = name

    def start(self, port: int = 0) -> Receiver:
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            try:
                self.loop.run_until_complete(self.serve(port))
                ready.set()
                self.loop.run_forever()
            finally:
                self.loop.close()

        self._thread = threading.Thread(target=run, name="receiver", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    async def serve(self, port: int = 0) -> None:
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Connection(self), "127.0.0.1", port, ssl=self.tls, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and end every connection."""
        if self._server is not None:
            self._server.close()
        # A connection accepted a moment ago meets its protocol a loop turn or two later;
        # one closed now would be missed and left to the garbage collector.
        for _ in range(3):
            await asyncio.sleep(0)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2
        while self.connections and loop.time() < deadline:  # each leaves in connection_lost
            await asyncio.sleep(0.005)

    def stop(self) -> None:
        if self._thread is not None:
            asyncio.run_coroutine_threadsafe(self.close(), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def sni_of(self, transport: asyncio.BaseTransport) -> str | None:
        ssl_object = transport.get_extra_info("ssl_object")
        return None if ssl_object is None else self._sni.get(id(ssl_object))


class _Connection(asyncio.Protocol):
    """One client connection: requests parsed as they arrive (a protocol, not streams:
    a fraction of the cost per request), each answered after its reply's delay, in order."""

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.pending: deque[list[Any]] = deque()  # [reply, close after it, ready], in order
        self.sni: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.sni = self.receiver.sni_of(transport)
        self.receiver.connections.add(self)
        self.receiver.accepted += 1

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.buffer[:end].decode("latin-1").split("\r\n")
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            size = int(headers.get("content-length", "0"))
            if len(self.buffer) < end + 4 + size:
                return
            body = self.buffer[end + 4:end + 4 + size]
            self.buffer = self.buffer[end + 4 + size:]
            method, target, _ = lines[0].split(" ", 2)
            self._request(Request(time.time_ns() // 1_000_000, method, target, headers, body, self.sni),
                          headers.get("connection", "").lower() == "close")

    def _request(self, req: Request, close: bool) -> None:
        rx = self.receiver
        rx.requests.append(req)
        rx.in_flight += 1
        rx.most_in_flight = max(rx.most_in_flight, rx.in_flight)
        entry: list[Any] = [rx.respond(req), close, False]
        self.pending.append(entry)
        asyncio.get_running_loop().call_later(entry[0].delay_s, self._done, entry)

    def _done(self, entry: list[Any]) -> None:
        self.receiver.in_flight -= 1
        entry[2] = True
        # HTTP/1.1 answers in order: write every reply whose turn has come (a client
        # that does not pipeline has one at a time).
        while self.pending and self.pending[0][2] and self.transport is not None:
            reply, close, _ = self.pending.popleft()
            extra = "".join(f"{k}: {v}\r\n" for k, v in reply.headers.items())
            self.transport.write(f"HTTP/1.1 {reply.status} X\r\nContent-Length: {len(reply.body)}\r\n"
                                 f"{extra}\r\n".encode("latin-1") + reply.body)
            if close:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.receiver.connections.discard(self)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--delay-ms", type=float, default=50.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    delay = args.delay_ms / 1000
    receiver = Receiver(lambda req: Reply(delay_s=delay))
    loop = receiver.loop
    asyncio.set_event_loop(loop)
    loop.run_until_complete(receiver.serve(args.port))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, loop.stop)
    print(f"listening on {receiver.port}", flush=True)
    loop.run_forever()
    loop.run_until_complete(receiver.close())
    loop.close()
    with open(args.out, "w") as out:
        for req in receiver.requests:
            out.write(f"{req.headers.get('scheduler-job-id', '-')} {req.arrival_ms}\n")
    print(f"wrote {len(receiver.requests)} requests to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
