"""``HOST:PORT`` addresses as the settings and the nudge path read them. Pure.

One parser for both ends: ``Settings.from_env`` checks ``SCHEDULER_NOTIFY_ADDRESS`` with it
before anything starts, and the poller binds (and producers send to) what it returns, so an
address the settings accepted can never fail later with a bare ``ValueError``.
"""

from __future__ import annotations

from ..errors import InvalidInput

ADDRESS_FORM = "HOST:PORT with a port of 0-65535 (e.g. 127.0.0.1:0; [::1]:PORT for IPv6)"


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` as (host without brackets, port); an empty host (``:PORT``) is
    127.0.0.1, port 0 lets the system pick one. Raises ``InvalidInput`` (a ``ValueError``)
    for anything else: no colon, a port that is not ASCII digits or above 65535, a host
    holding whitespace or a control character."""
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if (not sep or not (port.isascii() and port.isdigit()) or len(port) > 5 or int(port) > 65535
            or any(c.isspace() or not c.isprintable() for c in host) or "[" in host or "]" in host):
        raise InvalidInput(f"{address[:80]!r} is not {ADDRESS_FORM}")
    return host or "127.0.0.1", int(port)
