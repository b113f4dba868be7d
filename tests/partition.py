"""Cut the link between two groups of loopback addresses for one TCP port, with Linux
policy-routing rules (``ip rule ... prohibit``; needs root, as the CI runs).

This machine has no iptables, but ``ip rule`` can refuse a route: a rule placed before
the ``local`` table's makes every packet from one address to another on that port fail
at once (EACCES), both ways, while every other port between the same addresses works.
Cassandra's nodes then see each other down (their failure detector), and clients keep
their connections to every node. Rules use their own preferences (``CUT_PREF``, and
``LOCAL_PREF`` for the moved ``local`` lookup), so ``heal`` removes exactly what ``cut``
added; ``heal`` also runs first, so a test killed mid-cut does not leave one behind.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator, Sequence

CUT_PREF = 150
LOCAL_PREF = 200


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=10)


def _rules() -> str:
    return _ip("rule", "list").stdout


def heal() -> None:
    """Remove every rule ``cut`` adds and put the ``local`` lookup back first."""
    while f"{CUT_PREF}:" in _rules():
        _ip("rule", "del", "pref", str(CUT_PREF))
    if f"{LOCAL_PREF}:" in _rules():
        if not any(line.startswith("0:") and "lookup local" in line for line in _rules().splitlines()):
            _ip("rule", "add", "pref", "0", "lookup", "local")
        _ip("rule", "del", "pref", str(LOCAL_PREF))


@contextlib.contextmanager
def cut(side_a: Sequence[str], side_b: Sequence[str], port: int) -> Iterator[None]:
    """While inside: TCP to ``port`` from any address of one side to any of the other
    fails. Healed on the way out, whatever happened."""
    heal()
    # The local table's lookup moves behind the cut's rules (added first, so loopback
    # never lacks it).
    _ip("rule", "add", "pref", str(LOCAL_PREF), "lookup", "local")
    _ip("rule", "del", "pref", "0", "lookup", "local")
    try:
        for a in side_a:
            for b in side_b:
                for src, dst in ((a, b), (b, a)):
                    _ip("rule", "add", "pref", str(CUT_PREF), "from", src, "to", dst,
                        "ipproto", "tcp", "dport", str(port), "prohibit")
        yield
    finally:
        heal()
