"""Recurring schedules: a rule (cron or interval) in a time zone, each occurrence an
ordinary one-shot job. ``rule.py`` is the pure part: parsing and nominal times."""

from .rule import Rule, parse_duration

__all__ = ["Rule", "parse_duration"]
