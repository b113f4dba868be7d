"""The rules, without I/O: job keys and shards, the job model, bucket layouts, progress
and checkpoints, retention, clocks (passed in, never read here), rate limits, the shard
plan and its assignment, durations, the effects that let one producer rule run sync or
async, job specs and handlers (``dispatch``). Everything else builds on this; it imports
only ``scheduler.errors``."""
