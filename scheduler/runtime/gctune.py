"""The cyclic garbage collector's thresholds for a poller process.

A poller holds many objects for seconds at a time: every job read ahead sits in the due
queue until it fires (a whole minute's bucket at a time), and the recurring reader caches
schedules. With CPython's default thresholds (700, 10, 10) those long-lived objects are
scanned again and again: draining a backlog of 200,000 jobs ran 13 full (generation 2)
collections of up to 87 ms each, about a fifth of the drain's time, and 100,000
recurring schedules a minute ran one every 1.3 s (100-300 ms each), which was most of
that benchmark's late starts. The thresholds below collect the young generations 14
times less often and the oldest rarely: in the same drain the collector's time fell from
0.94 s to 0.24 s and its longest pause to 59 ms (``docs/benchmarks.md``, "Garbage
collection").

Reference counting frees almost everything a poller allocates the moment it is
dropped; only objects in reference cycles wait for the collector, and they still go at
the next young or full collection, so memory stays bounded (``poller_rss_backlog``
measures it).
"""

from __future__ import annotations

import gc

# (generation 0 allocations, generation 0 collections per generation 1 collection,
# generation 1 collections per full collection); CPython's defaults are (700, 10, 10).
POLLER_THRESHOLDS = (10_000, 10, 100)


def tune_gc() -> tuple[int, int, int]:
    """Set the poller's thresholds for this whole process; returns the previous ones (for
    ``gc.set_threshold(*previous)``). Never raises; calling it again changes nothing."""
    previous = gc.get_threshold()
    gc.set_threshold(*POLLER_THRESHOLDS)
    return previous
