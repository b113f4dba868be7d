"""The job operations of the API, on a ``Client``: the producer's own rules and effects
(``spec_from_dict`` and ``Producer.build`` validate and place, ``Producer.write_jobs``
writes, ``Client.reschedule``/``cancel``/``describe`` do the rest). Blocking: the
routes run them in a thread.

Idempotency, as for a ``Client``, by job id: the same job again (same kind, due time,
payload, priority and key) answers 201 with the stored job and changes nothing, even
after it fired; it also repairs a write of an earlier try that may have landed behind a
poller's cursor, as ``schedule`` does. What ``Client.schedule`` takes for a reschedule
(the same id with another due time, or another kind or payload) is refused here with
409: the API moves a job only on ``PATCH``. The comparison is ``same_job``; jitter is
not stored, so it is not compared.

Two requests racing to create one id with two different jobs are told apart by the
store's answer where they can be (the loser gets 409), but the store keeps no lock
between its read and its write: when the two due times differ, the later write moves
the job, as two racing ``Client.schedule`` calls would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..domain.effects import Steps, call
from ..domain.jobspec import JobSpec, canonical, spec_from_dict
from ..domain.model import Job, Status
from ..errors import InvalidInput
from ..observe.tracing import producer_span
from ..producer.client import Client
from ..producer.jobview import JobView
from .body import fields, json_type, time_field
from .respond import ApiError, as_fields

# The fields of a job in POST /v1/jobs and /v1/jobs/batch (``jitter``: seconds, as in
# ``scheduler load``).
JOB_FIELDS = ("id", "at", "kind", "payload", "priority", "key", "jitter")


@dataclass(frozen=True)
class Outcome:
    """What became of one job of a request: 201 (stored), 400 or 409, with the stored
    job (``Job``) or the error."""

    job_id: str | None
    status: int
    job: Job | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """One entry of a batch's ``results``."""
        out: dict[str, Any] = {"id": self.job_id, "status": self.status}
        if self.job is not None:
            out["job"] = JobView(self.job).to_dict()
        else:
            refused = self.status == 400
            out["error"] = as_fields(self.error) if refused and self.error else self.error
        return out


def same_job(stored: Job, new: Job) -> bool:
    """Whether ``new`` (placed, not written) is the job ``stored`` holds: kind, due time,
    priority, key and payload (JSON compared by value). Pure."""
    if (stored.kind, stored.due_ms, stored.priority, stored.key, stored.data_json) != \
            (new.kind, new.due_ms, new.priority, new.key, new.data_json):
        return False
    if stored.data == new.data:
        return True
    if not stored.data_json:
        return False
    try:
        return canonical(stored.data) == canonical(new.data)
    except (ValueError, RecursionError):  # a poison row's payload
        return False


def spec_of(raw: Any, index: int) -> JobSpec:
    """A ``JobSpec`` from one job object of a request: its fields are ``JOB_FIELDS``,
    ``id``, ``at`` and ``kind`` required; then ``spec_from_dict``, the rules of
    ``scheduler load``. Raises ``InvalidInput`` naming the job."""
    what = f"job #{index + 1}"
    body = fields(raw, JOB_FIELDS, what)
    for name in ("id", "at", "kind"):
        if name not in body:
            raise InvalidInput(f"{what}: missing field {name!r}")
    if not isinstance(body["id"], str):
        raise InvalidInput(f"{what}: id must be a string, not {json_type(body['id'])}")
    return spec_from_dict(body, index)


class JobOps:
    def __init__(self, client: Client) -> None:
        self.client = client

    def schedule(self, raws: list[Any]) -> list[Outcome]:
        """Each job of ``raws`` checked, then the valid ones written together: an
        ``Outcome`` each, in order. A store failure raises (nothing is said about any
        job; the same request again is safe)."""
        client = self.client
        out: list[Outcome | None] = [None] * len(raws)
        specs: dict[int, JobSpec] = {}
        for i, raw in enumerate(raws):
            try:
                specs[i] = spec_of(raw, i)
            except InvalidInput as exc:
                out[i] = Outcome(given_id(raw), 400, error=str(exc))
        # One producer span for the request (a child of its incoming traceparent, if any).
        with producer_span("scheduler.schedule_many") as traceparent:
            built = client.run(self._build(specs, traceparent))
            placed: dict[int, Job] = {}
            first: dict[str, int] = {}
            for i, job in built.items():
                if isinstance(job, InvalidInput):
                    out[i] = Outcome(given_id(raws[i]), 400, error=str(job))
                elif job.job_id in first:
                    out[i] = Outcome(job.job_id, 400, error=f"job #{i + 1}: id {job.job_id!r} is also job "
                                                            f"#{first[job.job_id] + 1} of this request")
                else:
                    first[job.job_id] = i
                    placed[i] = job
            if placed:
                ids = [job.job_id for job in placed.values()]
                existing: dict[str, Job] = client.run(client.producer.retrying(lambda: call("get_many", ids)))
                todo = []
                for i, job in placed.items():
                    old = existing.get(job.job_id)
                    if old is not None and not same_job(old, job):
                        out[i] = conflict(i, old)
                    else:
                        todo.append(i)
                written = client.run(client.producer.write_jobs([placed[i] for i in todo])) if todo else []
                for i, stored in zip(todo, written, strict=True):
                    # Another request may have written this id since the read above.
                    out[i] = Outcome(stored.job_id, 201, stored) if same_job(stored, placed[i]) \
                        else conflict(i, stored)
        return [o for o in out if o is not None]

    def _build(self, specs: dict[int, JobSpec],
               traceparent: str | None = None) -> Steps[dict[int, Job | InvalidInput]]:
        """Each spec checked and placed by ``Producer.build`` (writes nothing), in one run
        of effects: the placed job, or why it was refused (``schedule_many``'s message)."""
        now = self.client.clock.now_ms()
        out: dict[int, Job | InvalidInput] = {}
        for i, spec in specs.items():
            try:
                out[i] = yield from self.client.producer.build(spec, now, traceparent)
            except InvalidInput as exc:
                out[i] = InvalidInput(f"job #{i + 1} ({spec.job_id!r}): {exc}")
        return out

    def get(self, job_id: str) -> dict[str, Any]:
        """``scheduler get --json`` of the job; ``JobNotFound``."""
        return self.client.describe(job_id).to_dict()

    def reschedule(self, job_id: str, body: Any) -> dict[str, Any]:
        """Move the job to ``body["at"]``; the job as ``get``. ``JobNotFound``; 409 for a
        dead job, which only the admin's replay arms again (with its attempts reset)."""
        at = time_field(fields(body, ("at",), "the body"), "at", required=True)
        assert at is not None  # required
        # Client.reschedule re-arms a dead job too; over HTTP that would let the producer
        # role do the admin's replay. A job that dies between this read and the move is
        # armed again by the move, as if the move had come first; its dead letter then
        # stays listed, but a replay refuses it (the job is no longer dead), so it cannot
        # make the job fire twice.
        if self.client.get(job_id).status is Status.DEAD:
            raise ApiError(409, f"job {job_id!r} is dead: arm it again with POST /v1/dead/{{id}}/replay "
                                "(admin role)")
        self.client.reschedule(job_id, at)
        return self.get(job_id)

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel the pending job; the job as ``get``. Cancelling a cancelled job again
        answers the same; ``JobNotFound`` for none, 409 for a job that is not pending
        (it fired, or it is dead: nothing to cancel)."""
        done = self.client.cancel(job_id)
        view = self.get(job_id)
        if not done and view["status"] != str(Status.CANCELLED):
            raise ApiError(409, f"job {job_id!r} is {view['status']}, not pending: there is nothing to "
                                "cancel (GET it to see why)")
        return view


def given_id(raw: Any) -> str | None:
    """The id a refused job gave, when it gave one as text."""
    given = raw.get("id") if isinstance(raw, dict) else None
    return given if isinstance(given, str) else None


def conflict(index: int, stored: Job) -> Outcome:
    return Outcome(stored.job_id, 409, error=(
        f"job #{index + 1}: id {stored.job_id!r} is taken by another job (kind, due time, payload, "
        "priority or key differ): choose another id, or PATCH the job to move it"))

