"""A fault-injecting TCP proxy for tests: one process cut off from a server while the
others still reach it.

``cut()`` models a network partition: nothing more is delivered in either direction on
open connections and new connections are accepted but never answered, so clients see
timeouts, not refusals. ``restore()`` heals it; connections that were open during the
cut are closed then (their streams lost bytes, as a real connection would have timed
out), and clients reconnect. ``delay_s`` holds what the server sends back that long
(latency, not a bandwidth limit: chunks behind are not held up further). Listens on
127.0.0.1 only. Tested by
``tests/unit/test_faultproxy.py``.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time


class FaultProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._conns: list[tuple[socket.socket, socket.socket | None]] = []
        self._stale: list[socket.socket] = []
        self.accepted = 0
        self.delay_s = 0.0  # added to every server -> client chunk from now on
        threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        with self._lock:
            self._cut.set()
            # Everything open now belongs to the partition: closed when it heals.
            for client, upstream in self._conns:
                self._stale.append(client)
                if upstream is not None:
                    self._stale.append(upstream)
            self._conns.clear()

    def restore(self) -> None:
        with self._lock:
            self._cut.clear()
            stale, self._stale = self._stale, []
        for sock in stale:
            _close(sock)

    def close(self) -> None:
        self._closed.set()
        _close(self._listener)
        with self._lock:
            socks = [s for c, u in self._conns for s in (c, u) if s is not None] + self._stale
            self._conns.clear()
            self._stale.clear()
        for sock in socks:
            _close(sock)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            if self._cut.is_set():
                with self._lock:
                    self._stale.append(client)  # accepted, never answered
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._conns.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, back: bool = False) -> None:
        held: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
        if back:
            threading.Thread(target=self._release, args=(held, dst), daemon=True).start()
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if self._cut.is_set():
                    continue  # the partition swallows it
                if (back and self.delay_s > 0) or not held.empty():
                    held.put((time.monotonic() + self.delay_s, data))  # in order, behind the rest
                else:
                    dst.sendall(data)
        except OSError:
            pass
        held.put(None)
        if not self._cut.is_set():
            # An orderly close on one side ends the connection on both.
            _close(src)
            _close(dst)


    def _release(self, held: queue.Queue[tuple[float, bytes] | None], dst: socket.socket) -> None:
        """Send each held chunk when its time comes (the delayed direction)."""
        while (item := held.get()) is not None:
            at, data = item
            time.sleep(max(0.0, at - time.monotonic()))
            try:
                dst.sendall(data)
            except OSError:
                return


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
