"""Benchmarks (``ops/bench``; each module also runs alone with ``python -m bench.NAME``).

Every benchmark process runs with the garbage-collector thresholds that ``scheduler
run`` sets for a poller process (``scheduler.runtime.gctune``), so an in-process poller
is measured as it runs in production. The baselines in the same process (the bare
driver loops, the Postgres peer's workers) run under the same thresholds.
"""

from scheduler.runtime.gctune import tune_gc

tune_gc()
