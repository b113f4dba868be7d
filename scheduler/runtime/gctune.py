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
dropped; only objects in reference cycles wait for the collector, and they still go at
the next young or full collection, so memory stays bounded (``poller_rss_backlog``
measures it).
"""

from __future__ import annotations

import gc

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
