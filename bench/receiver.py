"""A small HTTP/1.1 receiver on asyncio, for the ``http_targets`` benchmark and the tests
of HTTP targets: it records every request (arrival time, method, target, headers, body)
and answers as its ``respond`` function says, after that function's delay, keeping
connections alive. One thread (or one process: ``python -m bench.receiver``) serves any
number of slow requests at once.

    .venv/bin/python -m bench.receiver [--port 0] [--delay-ms 50] --out FILE

prints ``listening on PORT`` and, on SIGTERM or SIGINT, writes one ``job_id arrival_ms``
line per request to FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


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
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", port, ssl=self.tls,
                                                  backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and end every connection."""
        if self._server is not None:
            self._server.close()
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        if self._thread is not None:
            asyncio.run_coroutine_threadsafe(self.close(), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ssl_object = writer.get_extra_info("ssl_object")
        sni = self._sni.get(id(ssl_object)) if ssl_object is not None else None
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                req = Request(time.time_ns() // 1_000_000, method, target, headers, body, sni)
                self.requests.append(req)
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
                try:
                    reply = self.respond(req)
                    if reply.delay_s:
                        await asyncio.sleep(reply.delay_s)
                finally:
                    self.in_flight -= 1
                extra = "".join(f"{k}: {v}\r\n" for k, v in reply.headers.items())
                writer.write(f"HTTP/1.1 {reply.status} X\r\nContent-Length: {len(reply.body)}\r\n{extra}\r\n"
                             .encode("latin-1") + reply.body)
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            return
        finally:
            with contextlib.suppress(Exception):
                writer.close()


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
