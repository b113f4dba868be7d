"""The cyclic garbage collector's thresholds for a poller process.

A poller holds many objects for seconds at a time: every job read ahead sits in the due
queue until it fires (a whole minute's bucket at a time), and the recurring reader caches
schedules. With CPython's default thresholds (700, 10, 10) those long-lived objects are
scanned again and again: draining a backlog of 200,000 jobs ran 13 full collections of
up to 75 ms each, 1.07 s of collecting in all; 100,000 recurring schedules a minute ran
one every 1.3 s (100-300 ms each), which caused most of that benchmark's late starts.
Collecting the youngest generation every 10,000 net allocations instead of 700 makes
every older collection 14 times rarer too: the same drain collected for 0.21 s, its
longest pause 13 ms, and fired 1.26 times as fast (``python -m bench.gcpauses``;
``docs/benchmarks.md``, "Garbage collection").

Reference counting frees almost everything a poller allocates the moment it is
dropped; only objects in reference cycles (a handler's exception with its traceback,
say) wait for the collector, and they go at the next collection of their generation.
Handlers run under the same thresholds. ``SCHEDULER_GC_THRESHOLDS`` (``poller``, ``keep``
or ``A,B,C``) or ``run_poller(gc_thresholds=...)`` chooses others.
"""

from __future__ import annotations

import gc
import re

from ..errors import ConfigError

# (generation 0 allocations, generation 0 collections per generation 1 collection,
# generation 1 collections per full collection); CPython's defaults are (700, 10, 10).
POLLER_THRESHOLDS = (10_000, 10, 10)
THRESHOLD_MAX = 1_000_000_000
# ASCII digits only: int() also reads other scripts' digits and underscores.
_THREE = re.compile(r" *([0-9]{1,10}) *, *([0-9]{1,10}) *, *([0-9]{1,10}) *", re.ASCII)


def tune_gc(thresholds: tuple[int, int, int] = POLLER_THRESHOLDS) -> tuple[int, int, int]:
    """Set ``thresholds`` (by default the poller's) for this whole process; returns the
    previous ones (for ``gc.set_threshold(*previous)``). Calling it again with the same
    thresholds changes nothing."""
    previous = gc.get_threshold()
    gc.set_threshold(*thresholds)
    return previous


def thresholds(value: str | tuple[int, int, int]) -> tuple[int, int, int] | None:
    """The thresholds ``value`` asks for: ``"poller"`` (``POLLER_THRESHOLDS``), ``"keep"``
    (None: leave the process's as they are), ``"A,B,C"`` or a tuple of three integers, the
    first at least 1 (0 would turn the collector off), none above ``THRESHOLD_MAX`` (the
    collector keeps them as C ints). Raises ``ConfigError`` for anything else, in one line
    naming the setting and showing at most 40 characters of what was given."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("poller", "keep"):
            return POLLER_THRESHOLDS if text == "poller" else None
        parsed = _THREE.fullmatch(text)
        got: tuple[int, ...] = tuple(int(g) for g in parsed.groups()) if parsed else ()
    else:
        got = tuple(value)
    if (len(got) != 3 or not all(type(v) is int and 0 <= v <= THRESHOLD_MAX for v in got)
            or got[0] == 0):
        raise ConfigError(f"SCHEDULER_GC_THRESHOLDS={str(value)[:40]!r} is not poller, keep or three "
                          f"integers A,B,C (1 <= A, all <= {THRESHOLD_MAX}), e.g. 10000,10,10")
    a, b, c = got
    return a, b, c
