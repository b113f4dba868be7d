"""What ``scheduler get`` shows of one job: its status, payload, attempts, last error and
fired time, and where it came from: the job a re-fire copied (``scheduler refire``), the
schedule an occurrence belongs to, and each replay of its dead letter.

Where the values come from: the job's lookup row (``fired_at`` there is the last failed
attempt of a pending job, its death of a dead one; a fired job's is its bucket row's),
the replay records (``store.history``, schema v005), and, for a re-fired job, the old
job's row, read by the id kept in the new id (``refire:<from>-<to>:<old id>``).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from ..domain.effects import Steps, call
from ..domain.keys import from_ms
from ..domain.model import REFIRE_RE, Job, Status, parse_occurrence
from ..errors import SchemaError
from ..store.history import Replay
from .producer import Producer

# The payload shown in the text view, at most (``--json`` shows it whole).
PAYLOAD_CHARS = 2000


@dataclass(frozen=True)
class RefireSource:
    """The job a re-fired job copied, and the window its firing was found in."""

    job_id: str  # ``#<hash>`` when the old id was too long to keep whole
    window: tuple[int, int]
    fired_ms: int | None  # the old job's last firing; None when it is no longer stored


@dataclass(frozen=True)
class JobView:
    job: Job
    replays: tuple[Replay, ...] = ()
    refired: RefireSource | None = None

    def to_dict(self) -> dict[str, Any]:
        """``Job.to_dict`` with the payload and the job's origin: the ``--json`` view."""
        job = self.job
        out = job.to_dict()
        if job.data_json:
            try:
                out["payload"], out["payload_encoding"] = json.loads(job.data), "json"
            except (ValueError, RecursionError):  # a poison row's
                out["payload"], out["payload_encoding"] = base64.b64encode(job.data).decode(), "base64"
        else:
            out["payload"], out["payload_encoding"] = base64.b64encode(job.data).decode(), "base64"
        src = self.refired
        out["refired"] = None if src is None else {
            "from_job": src.job_id, "window_from": iso(src.window[0]), "window_to": iso(src.window[1]),
            "original_fired_at": iso(src.fired_ms)}
        occ = parse_occurrence(job.job_id)
        out["occurrence_of"] = None if occ is None else {"schedule_id": occ[0], "scheduled_for": iso(occ[2])}
        out["replays"] = [{"replayed_at": iso(r.replayed_ms), "died_at": iso(r.died_ms),
                           "attempts": r.attempts, "error": r.error} for r in self.replays]
        return out

    def lines(self) -> list[str]:
        """The text view: one ``key  value`` line each, control characters escaped."""
        job, d = self.job, self.to_dict()
        rows: list[tuple[str, str]] = [
            ("job_id", job.job_id), ("kind", job.kind), ("status", str(job.status)),
            ("due_at", d["due_at"]), ("fire_at", d["fire_at"]),
            ("fired_at", fired_text(job, d["fired_at"])), ("attempts", str(job.attempts)),
            ("last_error", job.last_error or "-"), ("payload", payload_text(job)),
            ("priority", str(job.priority)), ("key", "-" if job.key is None else job.key),
        ]
        if (src := self.refired) is not None:
            fired = (f"original fire at {iso(src.fired_ms)}" if src.fired_ms is not None
                     else "original no longer stored")
            rows.append(("origin", f"re-fired from job {src.job_id} / {fired} (window "
                                   f"{iso(src.window[0])} to {iso(src.window[1])})"))
        if (occ := d["occurrence_of"]) is not None:
            rows.append(("origin", f"occurrence of schedule {occ['schedule_id']} for {occ['scheduled_for']}"))
        for r in self.replays:
            tries = f"{r.attempts} attempt{'' if r.attempts == 1 else 's'}"
            rows.append(("history", f"replayed from dead letter at {iso(r.replayed_ms)} (it died at "
                                    f"{iso(r.died_ms)} after {tries}: {r.error or '-'})"))
        width = max(len(k) for k, _ in rows)
        return [f"{k:<{width}}  {shown(v)}" for k, v in rows]


def iso(ms: int | None) -> str | None:
    return None if ms is None else from_ms(ms).isoformat()


def shown(text: str) -> str:
    """``text`` with every non-printable character escaped, so that a job id, an error or
    a payload cannot move the cursor or recolour a terminal."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def fired_text(job: Job, fired: str | None) -> str:
    if fired is None:
        return "-"
    if job.status is Status.PENDING:
        return f"{fired} (its last failed attempt)"
    return f"{fired} (its last attempt)" if job.status is Status.DEAD else fired


def payload_text(job: Job) -> str:
    if job.data_json:
        try:
            text = json.dumps(json.loads(job.data), ensure_ascii=False)
        except (ValueError, RecursionError):
            text = f"(not valid JSON) {job.data[:PAYLOAD_CHARS]!r}"
    else:
        text = f"({len(job.data)} bytes, base64) {base64.b64encode(job.data).decode()}"
    return text if len(text) <= PAYLOAD_CHARS else f"{text[:PAYLOAD_CHARS]}... ({len(job.data)} bytes)"


def describe(producer: Producer, job_id: str) -> Steps[JobView]:
    """The job's view; raises ``JobNotFound`` when there is no such job."""
    job = yield from producer.get(job_id)
    try:
        replays = yield from producer.retrying(lambda: call("replays", job_id))
    except SchemaError:
        replays = []  # a store older than v005 kept no record of replays
    refired = None
    if (m := REFIRE_RE.match(job_id)) is not None:
        old_id = m.group(3)
        old = yield from producer.retrying(lambda: call("get", old_id))
        refired = RefireSource(old_id, (int(m.group(1)), int(m.group(2))),
                               None if old is None else old.fired_ms)
    return JobView(job, tuple(replays), refired)
