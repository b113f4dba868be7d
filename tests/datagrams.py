"""Sending UDP datagrams to a poller's nudge listener, for every test that does (one
helper instead of a socket per test): ``send`` for a few, ``Sender`` to keep one socket
for many (a flood)."""

from __future__ import annotations

import socket
from types import TracebackType


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPV6]:PORT`` (as ``Nudges.bind`` returns it) as host and port."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class Sender:
    """One UDP socket sending to ``address``; closed on leaving the ``with`` block."""

    def __init__(self, address: str) -> None:
        self.target = split_address(address)
        family = socket.AF_INET6 if ":" in self.target[0] else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sent = 0

    def send(self, *datagrams: bytes) -> None:
        for d in datagrams:
            self.sock.sendto(d, self.target)
            self.sent += 1

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.sock.close()


def send(address: str, *datagrams: bytes) -> None:
    """Send ``datagrams`` to ``address``, in order, from one socket."""
    with Sender(address) as sender:
        sender.send(*datagrams)
