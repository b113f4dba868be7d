"""Recurring schedules, the pure part: a rule (cron or interval) in a time zone
(``rule``), a schedule's row and the ids of its occurrences (``schedule``), and the chain
that keeps one occurrence written ahead (``chain``). No I/O: the store stores these
types, so they sit below it. Writing occurrences and the ``Client.recurring`` API are in
``scheduler.producer``."""

from .rule import Rule, parse_duration

__all__ = ["Rule", "parse_duration"]
