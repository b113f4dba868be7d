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

from ..errors import ConfigError

# (generation 0 allocations, generation 0 collections per generation 1 collection,
# generation 1 collections per full collection); CPython's defaults are (700, 10, 10).
POLLER_THRESHOLDS = (10_000, 10, 10)


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
    first at least 1 (0 would turn the collector off) and the others at least 0. Raises
    ``ConfigError`` for anything else, naming the setting."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "poller":
            return POLLER_THRESHOLDS
        if text == "keep":
            return None
        parts = text.split(",")
        try:
            value = (int(parts[0]), int(parts[1]), int(parts[2])) if len(parts) == 3 else (0, -1, -1)
        except ValueError:
            value = (0, -1, -1)
    if len(value) != 3 or not all(isinstance(v, int) for v in value) or value[0] < 1 or min(value) < 0:
        raise ConfigError(f"SCHEDULER_GC_THRESHOLDS={str(value)[:40]!r} is not poller, keep or three "
                          "integers A,B,C (A >= 1), e.g. 10000,10,10")
    return value
