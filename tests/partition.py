"""Cut the link between two groups of loopback addresses for one TCP port, with Linux
policy-routing rules (``ip rule ... prohibit``; needs root, as the CI runs).

This machine has no iptables, but ``ip rule`` can refuse a route: a rule placed before
the ``local`` table's makes every packet from one address to another on that port fail
at once (EACCES), both ways, while every other port between the same addresses works.
The rules hold for the whole machine while they exist: run nothing else on those
addresses and that port meanwhile.
Cassandra's nodes then see each other down (their failure detector), and clients keep
their connections to every node. Rules use their own preferences (``CUT_PREF``, and
``LOCAL_PREF`` for the moved ``local`` lookup), so ``heal`` removes exactly what ``cut``
added; ``heal`` also runs before a cut and when the two-DC cluster tests start
(``tests/cluster/conftest.py``), so a test killed mid-cut leaves nothing behind for long.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator, Sequence

CUT_PREF = 150
LOCAL_PREF = 200


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=10)


def _prefs() -> list[tuple[int, str]]:
    """(preference, rule text) of every rule, in order."""
    out = []
    for line in _ip("rule", "list").stdout.splitlines():
        pref, _, text = line.partition(":")
        if pref.strip().isdigit():
            out.append((int(pref), text.strip()))
    return out


def heal() -> None:
    """Remove every rule ``cut`` adds and put the ``local`` lookup back first. Touches
    only its own two preferences."""
    while any(p == CUT_PREF for p, _ in _prefs()):
        if _ip("rule", "del", "pref", str(CUT_PREF), check=False).returncode != 0:
            break
    if any(p == LOCAL_PREF and text.endswith("lookup local") for p, text in _prefs()):
        if not any(p == 0 and text.endswith("lookup local") for p, text in _prefs()):
            _ip("rule", "add", "pref", "0", "lookup", "local")
        _ip("rule", "del", "pref", str(LOCAL_PREF), "lookup", "local", check=False)


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
