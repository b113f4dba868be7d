"""Recurring schedules: a rule (cron or interval) in a time zone, each occurrence an
ordinary one-shot job. The pure parts are below this package, where the store can read
them: ``scheduler.recurring.rule`` (parsing and nominal times) and ``scheduler.recurring.schedule`` (a
schedule's row, the ids of its occurrences)."""

from .rule import Rule, parse_duration

__all__ = ["Rule", "parse_duration"]
