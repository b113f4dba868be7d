"""Durations as people type them on a command line: the one syntax every duration flag
of ``scheduler`` accepts. Pure, no I/O.

``10s``, ``5m``, ``1h``, ``2d``, or a bare number of seconds (``30``). Where a flag took
fractions of a second before (``--jitter 0.5``, ``--poll-interval 0.2``), ``seconds``
accepts a fraction (``0.5``, ``1.5m``); ``whole_seconds`` does not. No sign, no exponent,
no ``nan`` or ``inf``: anything else raises ``InvalidInput`` naming the flag, and
nothing else is raised for any text.
"""

from __future__ import annotations

import re

from ..errors import InvalidInput

UNITS = {"s": 1, "m": 60, "h": 3_600, "d": 86_400}
# Ten years: longer than any sensible flag, and far from float and int limits.
MAX_S = 3_650 * 86_400
SYNTAX = "{number} with s, m, h or d, or a bare number of seconds: e.g. 30s, 5m, 12h, 7d, 90"
_DURATION = re.compile(r"^\s*(\d{1,12})(?:\.(\d{1,9}))?\s*([smhd]?)\s*\Z", re.ASCII)


def _parse(text: object, what: str, fraction: bool) -> float:
    if not isinstance(text, str):
        raise InvalidInput(f"{what} must be a duration given as text, got {type(text).__name__}")
    m = _DURATION.match(text)
    if not m or (m.group(2) is not None and not fraction):
        syntax = SYNTAX.format(number="a number" if fraction else "a whole number")
        raise InvalidInput(f"{what} {text!r} is not a duration (use {syntax})")
    number = float(f"{m.group(1)}.{m.group(2) or 0}")
    return number * UNITS[m.group(3) or "s"]


def _bounded(value: float, text: str, what: str, allow_zero: bool, most_s: float) -> None:
    if value == 0 and not allow_zero:
        raise InvalidInput(f"{what} {text!r} must be longer than zero")
    if value > most_s:
        raise InvalidInput(f"{what} {text!r} is too long (the most is {format_seconds(most_s)})")


def seconds(text: str, what: str, *, allow_zero: bool = True, most_s: float = MAX_S) -> float:
    """Seconds of ``text``, fractions allowed (``0.5``, ``1.5m``). ``InvalidInput``
    naming ``what`` for anything that is not a duration, for zero unless
    ``allow_zero``, and above ``most_s``."""
    value = _parse(text, what, fraction=True)
    _bounded(value, text, what, allow_zero, most_s)
    return value


def whole_seconds(text: str, what: str, *, allow_zero: bool = False, most_s: int = MAX_S) -> int:
    """Whole seconds of ``text`` (``90``, ``90s``, ``12h``): as ``seconds``, but a
    fraction is refused, and zero too unless ``allow_zero``."""
    value = _parse(text, what, fraction=False)
    _bounded(value, text, what, allow_zero, most_s)
    return int(value)


def format_seconds(value: float) -> str:
    """The shortest exact form in the same syntax: 604800 -> ``7d``, 90 -> ``90s``,
    0.5 -> ``0.5s``."""
    if value == int(value):
        whole = int(value)
        for unit in ("d", "h", "m"):
            if whole and whole % UNITS[unit] == 0:
                return f"{whole // UNITS[unit]}{unit}"
        return f"{whole}s"
    return f"{value:.9f}".rstrip("0").rstrip(".") + "s"  # never an exponent: the syntax has none
