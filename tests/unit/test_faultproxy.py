"""The test suite's fault-injecting proxy does what the fault tests rely on."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from tests.faultproxy import FaultProxy


@pytest.fixture
def echo() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=lambda c=conn: _echo(c), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(4096):
            conn.sendall(data)


def roundtrip(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    return sock.recv(4096)


def test_forwards_then_partitions_then_heals(echo: int) -> None:
    with FaultProxy("127.0.0.1", echo) as proxy:
        open_conn = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        assert roundtrip(open_conn, b"before") == b"before"

        proxy.cut()
        open_conn.settimeout(0.5)
        with pytest.raises(TimeoutError):  # a partition: silence, not a refusal
            roundtrip(open_conn, b"during")
        new_conn = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        new_conn.settimeout(0.5)
        with pytest.raises(TimeoutError):
            roundtrip(new_conn, b"during")

        proxy.restore()
        # Connections of the partition are closed when it heals; new ones work.
        open_conn.settimeout(2)
        with contextlib.suppress(ConnectionError):
            assert open_conn.recv(4096) == b""
        fresh = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        assert roundtrip(fresh, b"after") == b"after"
        for s in (open_conn, new_conn, fresh):
            s.close()


def test_a_closed_target_side_closes_the_client_side(echo: int) -> None:
    with FaultProxy("127.0.0.1", echo) as proxy:
        conn = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        assert roundtrip(conn, b"x") == b"x"
        conn.shutdown(socket.SHUT_WR)
        assert conn.recv(10) == b""
        conn.close()


def test_a_delay_holds_the_answers_and_keeps_their_order(echo):
    import time

    with FaultProxy("127.0.0.1", echo) as proxy, socket.create_connection(("127.0.0.1", proxy.port)) as s:
        assert roundtrip(s, b"a") == b"a"
        proxy.delay_s = 0.2
        t0 = time.monotonic()
        s.sendall(b"b")
        s.sendall(b"c")
        got = b""
        while len(got) < 2:
            got += s.recv(16)
        assert got == b"bc" and time.monotonic() - t0 >= 0.2, "never sooner than the delay"
        proxy.delay_s = 0.0
        assert roundtrip(s, b"d") == b"d"
