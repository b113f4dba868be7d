"""The log formats: one line a record whatever an id or an error holds, the traceback
in the text format too, and UTC timestamps where the JSON says Z."""

from __future__ import annotations

import json
import logging
import sys

from scheduler.logs import JsonFormatter, TextFormatter, escape


def record(msg: str, *args: object, exc: bool = False, **extra: object) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("smtp down")
        except ValueError:
            exc_info = sys.exc_info()
    rec = logging.LogRecord("scheduler.poller", logging.WARNING, __file__, 1, msg, args, exc_info)
    rec.created = 1_800_000_000.25  # 2027-01-15T08:00:00.250Z
    rec.msecs = 250.0
    rec.__dict__.update(extra)
    return rec


def test_text_lines_escape_control_characters_in_messages_and_fields():
    line = TextFormatter().format(record("job %s failed: %s", "evil\x1b[31mid", "line one\nline two",
                                         action="job_attempt_failed", job_id="a\nb"))
    assert "\n" not in line and "\x1b" not in line
    assert "evil\\x1b[31mid" in line and "line one\\nline two" in line and "job_id=a\\nb" in line


def test_the_text_format_shows_the_traceback_on_indented_lines():
    line = TextFormatter().format(record("first failure", exc=True))
    first, *rest = line.split("\n")
    assert first.endswith("first failure")
    assert rest and all(r.startswith("    ") for r in rest)
    assert "Traceback (most recent call last)" in rest[0]
    assert rest[-1].strip() == "ValueError: smtp down"


def test_json_timestamps_are_utc_whatever_the_local_zone(monkeypatch):
    import time

    monkeypatch.setenv("TZ", "EST+05EDT,M3.2.0,M11.1.0")  # New York, as a POSIX rule: no zone files needed
    time.tzset()
    try:
        out = json.loads(JsonFormatter().format(record("x")))
    finally:
        monkeypatch.undo()
        time.tzset()
    assert out["ts"] == "2027-01-15T08:00:00.250Z"


def test_escape_keeps_printable_text_and_marks_bidi_controls():
    assert escape("plain ünïcode ✓") == "plain ünïcode ✓"
    assert escape("a\u202eb") == "a\\u202eb"
