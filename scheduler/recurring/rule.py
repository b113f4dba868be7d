"""The rule of a schedule lives in ``scheduler.rule`` (the store reads rules, and a store
must not import the recurring layer); this name is kept for the callers of the old path,
the CLI's recurring commands and the benchmarks."""

from ..rule import ALIASES, MAX_EVERY_S, Rule, parse_duration, zone

__all__ = ["ALIASES", "MAX_EVERY_S", "Rule", "parse_duration", "zone"]
