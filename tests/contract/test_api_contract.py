"""The HTTP API for producers on both stores, through its HTTP interface (Starlette's test
client): every endpoint, every error code, every role's refusals, idempotency, a body
over the limit, and the store made unreachable while the API runs (503 with
Retry-After, then the same API answers again). The real process, over a socket and
with TLS: tests/unit/test_api_cli.py."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from scheduler import Client
from scheduler.store import SchemaOptions, Store
from tests.apihelp import RANK, ROUTES, TOKENS, Api, one_error
from tests.conftest import make_store
from tests.procs import wait_until

LATER = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)
AT = LATER.isoformat().replace("+00:00", "Z")


@pytest.fixture
def api(store_kind: str, request: Any, tmp_path: Any) -> Iterator[Api]:
    store: Store = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=4))
    client = Client(store, retry_s=0.5)
    yield Api(client)
    client.close()
    store.close()


def job(job_id: str = "j1", **extra: Any) -> dict[str, Any]:
    return {"id": job_id, "at": AT, "kind": "email", "payload": {"to": "a@example.com"}, **extra}


def test_a_job_scheduled_read_moved_and_cancelled(api: Api):
    r = api.call("producer", "POST", "/v1/jobs", job(priority=7, key="customer-1"))
    assert r.status_code == 201, r.text
    # The job JSON is `scheduler get --json`'s, key for key and value for value.
    assert r.json() == api.client.describe("j1").to_dict()
    got = api.call("reader", "GET", "/v1/jobs/j1").json()
    assert got == r.json() and got["priority"] == 7 and got["key"] == "customer-1"
    assert got["payload"] == {"to": "a@example.com"} and got["status"] == "pending"
    later = LATER + timedelta(hours=2)
    moved = api.call("producer", "PATCH", "/v1/jobs/j1", {"at": later.isoformat()})
    assert moved.status_code == 200 and moved.json()["due_at"] == later.isoformat()
    assert api.client.get("j1").due_at == later
    cancelled = api.call("producer", "DELETE", "/v1/jobs/j1")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    again = api.call("producer", "DELETE", "/v1/jobs/j1")  # the same end state: the same answer
    assert again.status_code == 200 and again.json() == cancelled.json()
    # A cancelled job is armed again by a reschedule, as Client.reschedule does.
    rearmed = api.call("producer", "PATCH", "/v1/jobs/j1", {"at": (LATER + timedelta(hours=5)).isoformat()})
    assert rearmed.json()["status"] == "pending"


def test_a_job_moved_back_to_a_time_it_had_is_pending(api: Api):
    # The move back writes a row where a retired one was: it must not keep its fired_at.
    api.call("producer", "POST", "/v1/jobs", job())
    api.call("producer", "PATCH", "/v1/jobs/j1", {"at": (LATER + timedelta(hours=2)).isoformat()})
    back = api.call("producer", "PATCH", "/v1/jobs/j1", {"at": AT})
    assert back.status_code == 200 and back.json()["status"] == "pending", back.text


def test_ids_with_slashes_and_any_text_are_paths(api: Api):
    # (No "%" here: the test client decodes the path twice; the process test sends one.)
    odd = "tenant/42/order?# é"
    from urllib.parse import quote

    assert api.call("producer", "POST", "/v1/jobs", job(odd)).status_code == 201
    r = api.call("reader", "GET", "/v1/jobs/" + quote(odd, safe=""))
    assert r.status_code == 200 and r.json()["job_id"] == odd



@pytest.mark.parametrize("odd", ["a\nb", "ab\n", "\n", "line\r\nbreak\u2028"])
def test_every_id_the_api_takes_can_be_read_moved_replayed_and_cancelled(api: Api, odd: str):
    """Ids with a line break match the routes too (a route's ``{id:path}`` is ``.*``,
    which stops at a newline, and ``$`` matches before a final one: ``ab\n`` was read as
    ``ab``)."""
    from urllib.parse import quote

    path = quote(odd, safe="")
    api.call("producer", "POST", "/v1/jobs", job("ab"))
    assert api.call("producer", "POST", "/v1/jobs", job(odd)).status_code == 201
    got = api.call("reader", "GET", f"/v1/jobs/{path}")
    assert got.status_code == 200 and got.json()["job_id"] == odd, got.text
    later = (LATER + timedelta(hours=1)).isoformat()
    moved = api.call("producer", "PATCH", f"/v1/jobs/{path}", {"at": later})
    assert moved.status_code == 200 and moved.json()["job_id"] == odd, moved.text
    cancelled = api.call("producer", "DELETE", f"/v1/jobs/{path}")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled", cancelled.text
    assert api.client.get("ab").status.value == "pending", "another job was cancelled"
    api.client.store.record_dead(api.client.get("ab"), "HTTP 500", api.client.clock.now_ms())
    api.client.schedule(odd + "-dead", LATER, "payment", {})
    api.client.store.record_dead(api.client.get(odd + "-dead"), "HTTP 500", api.client.clock.now_ms())
    replayed = api.call("admin", "POST", f"/v1/dead/{quote(odd + '-dead', safe='')}/replay")
    assert replayed.status_code == 200 and replayed.json()["job_id"] == odd + "-dead", replayed.text
    body = {"kind": "report", "every": 3600}
    created = api.call("admin", "PUT", f"/v1/schedules/{path}", body)
    if created.status_code == 400:  # not a schedule id: then no route of schedules needs it
        return
    assert created.status_code == 201, created.text
    for method, tail, state in (("POST", "/pause", "paused"), ("POST", "/resume", "active"),
                                ("GET", "", "active")):
        r = api.call("admin", method, f"/v1/schedules/{path}{tail}")
        assert r.status_code == 200 and r.json()["state"] == state, (method, tail, r.text)
    assert api.call("admin", "DELETE", f"/v1/schedules/{path}").json()["deleted"] is True


def test_the_same_job_again_is_the_same_answer_and_another_job_is_409(api: Api):
    first = api.call("producer", "POST", "/v1/jobs", job())
    assert first.status_code == 201
    assert api.call("producer", "POST", "/v1/jobs", job()).json() == first.json()
    # The same payload written in another key order and spacing is the same job.
    reordered = {"kind": "email", "payload": {"to": "a@example.com"}, "at": LATER.isoformat(), "id": "j1"}
    assert api.call("producer", "POST", "/v1/jobs", reordered).status_code == 201
    for change in ({"kind": "sms"}, {"payload": {"to": "b@example.com"}}, {"payload": None},
                   {"at": (LATER + timedelta(seconds=1)).isoformat()}, {"priority": 9}, {"key": "k"}):
        one_error(api.call("producer", "POST", "/v1/jobs", {**job(), **change}), 409, "'j1'", "another job")
        batch = api.call("producer", "POST", "/v1/jobs/batch", {"jobs": [{**job(), **change}]})
        assert [r["status"] for r in batch.json()["results"]] == [409]
    assert api.call("reader", "GET", "/v1/jobs/j1").json() == first.json(), "nothing was changed"
    # A job that fired keeps answering the same (nothing is armed again); it cannot be cancelled.
    store = api.client.store
    store.record_fired([api.client.get("j1")], api.client.clock.now_ms())
    fired = api.call("producer", "POST", "/v1/jobs", job())
    assert fired.status_code == 201 and fired.json()["status"] == "fired"
    one_error(api.call("producer", "DELETE", "/v1/jobs/j1"), 409, "fired", "not pending")


def test_a_batch_answers_each_job_in_order(api: Api):
    api.call("producer", "POST", "/v1/jobs", job("taken"))
    jobs = [job("b1"), {"id": "b2"}, job("taken", kind="other"), job("b1"), job("b5"), 17,
            job("b3", priority=10), job("b4", payload=[1, 2]), job("taken")]
    r = api.call("producer", "POST", "/v1/jobs/batch", {"jobs": jobs})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [(x["id"], x["status"]) for x in results] == [
        ("b1", 201), ("b2", 400), ("taken", 409), ("b1", 400), ("b5", 201), (None, 400), ("b3", 400),
        ("b4", 201), ("taken", 400)]
    assert results[0]["job"]["job_id"] == "b1" and results[7]["job"]["payload"] == [1, 2]
    assert "missing field 'at'" in results[1]["error"] and "job #2" in results[1]["error"]
    assert "also job #1" in results[3]["error"] and "priority" in results[6]["error"]
    assert "also job #3" in results[8]["error"]
    assert all(set(x) == {"id", "status", "job" if x["status"] == 201 else "error"} for x in results)
    assert api.client.get("b1").kind == "email"
    assert {x.job_id for x in api.client.store.get_many(["b2", "b3"]).values()} == set()
    again = api.call("producer", "POST", "/v1/jobs/batch", {"jobs": [job("taken"), job("b1")]}).json()
    assert [x["status"] for x in again["results"]] == [201, 201]
    assert again["results"][1] == results[0], "the same job again: the same answer"
    assert api.call("producer", "POST", "/v1/jobs/batch", {"jobs": []}).json() == {"results": []}
    bad: Any
    for bad in ({}, {"jobs": {}}, {"jobs": None}, [], {"jobs": [], "extra": 1}):
        one_error(api.call("producer", "POST", "/v1/jobs/batch", bad), 400)


BAD_JOBS = [
    ([], "must be a JSON object"),
    ("j", "must be a JSON object"),
    ({"at": AT, "kind": "k"}, "missing field 'id'"),
    (job(at=None), "missing due_at"),
    ({"id": "j", "at": AT}, "missing field 'kind'"),
    (job(id=7), "id must be a string"),
    (job(id=""), "job id must be a non-empty string"),
    (job(id="x" * 300), "limit is 256 bytes"),
    (job(id="recurring:s:1:2"), "reserved"),
    (job(at="tomorrow"), "time"),
    (job(at="2030-01-01T09:00:00"), "offset"),
    (job(at=1_900_000_000), "must be a string"),
    (job(at="0001-01-01T00:00:00+14:00"), "time"),
    (job(kind="no spaces"), "kind"),
    (job(kind=["k"]), "kind"),
    (job(priority=10), "priority"),
    (job(priority=True), "priority"),
    (job(priority=5.0), "priority"),
    (job(priority=10**400), "too large for a double"),
    (job(key=""), "key"),
    (job(key="k" * 257), "key"),
    (job(key=5), "key"),
    (job(jitter=-1), "jitter"),
    (job(jitter="5s"), "jitter"),
    (job(payload="x" * 70_000), "payload"),
    (job(unknown=1), "unknown field(s) 'unknown'"),
    ({**job("j"), "job_id": "j"}, "unknown field(s) 'job_id'"),
]


def test_a_bad_job_is_400_with_one_line_and_nothing_written(api: Api):
    # One store for every case (a keyspace each would take minutes).
    for body, says in BAD_JOBS:
        one_error(api.call("producer", "POST", "/v1/jobs", body), 400, says)
        assert api.client.store.get_many(["j", "j1", "x" * 300]) == {}, body


BAD_BYTES = [
    (b'{"id": "j1", "at": "' + AT.encode() + b'", "kind": "k", "payload": 1e400}', "too large"),
    (b'{"id": "j1", "at": "' + AT.encode() + b'", "kind": "k", "payload": NaN}', "not JSON"),
    (b'{"id": "j1", "at": "' + AT.encode() + b'", "kind": "k", "payload": "\xff"}', "not UTF-8"),
    (b"[" * 65 + b"]" * 65, "more than 64 deep"),
    (b"[" * 100_000, "nested too deeply"),
    (b'{"id": "j1", "at": "' + AT.encode() + b'", "kind": "k", "payload": ' + b"9" * 5000 + b"}", "JSON"),
    (b"", "the body is empty"),
    (b'{"id": "j1",', "not valid JSON"),
    (b"\xef\xbb\xbf{}", "JSON"),
]


def test_bytes_that_are_not_strict_json_are_400(api: Api):
    for raw, says in BAD_BYTES:
        one_error(api.call("producer", "POST", "/v1/jobs", content=raw), 400, says)
        one_error(api.call("producer", "POST", "/v1/jobs/batch", content=raw), 400, says)
        assert api.client.store.get_many(["j1"]) == {}, raw[:80]


def test_a_body_over_1_mib_is_413_before_or_while_it_is_read(api: Api):
    big = {"jobs": [job(f"big{i}", payload="x" * 1000) for i in range(1100)]}
    one_error(api.call("producer", "POST", "/v1/jobs/batch", big), 413, "1 MiB")
    assert api.client.store.get_many(["big0"]) == {}
    # Small, but too many: each job's answer would be larger than the job.
    many = {"jobs": [job("many0")] + [{}] * 10_000}
    one_error(api.call("producer", "POST", "/v1/jobs/batch", many), 400, "at most 10000")
    assert api.client.store.get_many(["many0"]) == {}
    # Without a Content-Length (chunked), and with one over the limit. (How little is read
    # is checked on the parser alone, tests/unit/test_api_parts.py: this client sends all.)
    one_error(api.call("producer", "POST", "/v1/jobs", content=iter([b" " * 65536] * 17)), 413)
    one_error(api.call("producer", "POST", "/v1/jobs", content=b"{}",
                       headers={"content-length": str(2**20 + 1)}), 413)
    one_error(api.call("producer", "POST", "/v1/jobs", content=b"{}", headers={"content-length": "x2"}),
              400, "Content-Length")
    ok = {"jobs": [job(f"fits{i}", payload="x" * 900) for i in range(1000)]}  # just under 1 MiB
    assert [x["status"] for x in api.call("producer", "POST", "/v1/jobs/batch", ok).json()["results"]] \
        == [201] * 1000


def test_every_role_is_refused_what_it_may_not_do_and_nothing_is_written(api: Api, caplog: Any):
    caplog.set_level(logging.INFO, logger="scheduler")
    bodies = {"/v1/jobs": job("refused"), "/v1/jobs/batch": {"jobs": [job("refused")]},
              "/v1/schedules/{id}": {"kind": "tick", "every": "5m"}}
    for (method, path), least in ROUTES.items():
        concrete = path.replace("{id}", "refused")
        body = bodies.get(path) if method in ("POST", "PUT", "PATCH") else None
        if method == "PATCH":
            body = {"at": AT}
        for role in (None, "reader", "producer", "admin"):
            if least is None or RANK[role] >= RANK[least]:
                continue
            r = api.call(role, method, concrete, body)
            if role is None:
                one_error(r, 401, "Authorization: Bearer")
                assert r.headers["www-authenticate"].startswith("Bearer")
            else:
                one_error(r, 403, f"the {role} role may not", f"role {least}")
        admin = TOKENS["admin"]
        for header in ("Bearer nope-nope-nope-nope", f"Basic {admin}", admin, f"Bearer {admin}x",
                       f"Bearer {admin[:-1]}", "Bearer ", "Bearer é".encode()):
            if least is not None:
                one_error(api.call(None, method, concrete, body, headers={"authorization": header}), 401)
    assert api.client.store.get_many(["refused"]) == {}
    assert api.call("admin", "GET", "/v1/schedules/refused").status_code == 404
    for token in TOKENS.values():
        assert token not in caplog.text
    # Case and spacing of the scheme do not matter; the token does.
    ok = api.call(None, "GET", "/v1/jobs/none", headers={"authorization": f"bearer   {TOKENS['reader']} "})
    one_error(ok, 404, "no job")


def test_schedules_put_get_pause_resume_delete(api: Api):
    body = {"kind": "report", "cron": "0 3 * * *", "tz": "Europe/Lisbon", "payload": {"a": 1, "b": [2]},
            "priority": 2}
    created = api.call("admin", "PUT", "/v1/schedules/nightly", body)
    assert created.status_code == 201, created.text
    view = created.json()
    assert view == api.client.recurring.view(api.client.recurring.get("nightly"))
    assert view["state"] == "active" and view["version"] == 1 and view["priority"] == 2
    same = api.call("admin", "PUT", "/v1/schedules/nightly", body)
    assert same.status_code == 200 and same.json()["version"] == 1
    # The same payload with its keys in another order is the same definition.
    reordered = api.call("admin", "PUT", "/v1/schedules/nightly", {**body, "payload": {"b": [2], "a": 1}})
    assert reordered.status_code == 200 and reordered.json()["version"] == 1, reordered.text
    changed = api.call("admin", "PUT", "/v1/schedules/nightly", {"kind": "report", "every": 3600})
    assert changed.status_code == 200 and changed.json()["version"] == 2
    assert changed.json()["every_s"] == 3600 and changed.json()["cron"] is None
    assert changed.json()["priority"] == 5 and changed.json()["tz"] == "UTC", "a field left out: its default"
    assert api.call("reader", "GET", "/v1/schedules/nightly").json() == changed.json()
    paused = api.call("admin", "POST", "/v1/schedules/nightly/pause")
    assert paused.status_code == 200 and paused.json()["state"] == "paused"
    resumed = api.call("admin", "POST", "/v1/schedules/nightly/resume")
    assert resumed.status_code == 200 and resumed.json()["state"] == "active"
    deleted = api.call("admin", "DELETE", "/v1/schedules/nightly")
    assert deleted.status_code == 200 and deleted.json() == {"schedule_id": "nightly", "deleted": True}
    one_error(api.call("reader", "GET", "/v1/schedules/nightly"), 404, "nightly")
    for method, path in (("DELETE", ""), ("POST", "/pause"), ("POST", "/resume")):
        one_error(api.call("admin", method, "/v1/schedules/nightly" + path), 404)


BAD_SCHEDULES = [
    ({"every": "5m"}, "missing field 'kind'"),
    ({"kind": "k"}, "exactly one of"),
    ({"kind": "k", "cron": "0 3 * * *", "every": "5m"}, "give exactly one of cron or every"),
    ({"kind": "k", "cron": "61 * * * *"}, "cron"),
    ({"kind": "k", "cron": 5}, "cron must be a string"),
    ({"kind": "k", "every": True}, "every must be a duration"),
    ({"kind": "k", "every": 1.5}, "every must be a duration"),
    ({"kind": "k", "every": "-5m"}, "every"),
    ({"kind": "k", "every": "5m", "tz": "Mars/Base"}, "Mars/Base"),
    ({"kind": "k", "every": "5m", "tz": ["UTC"]}, "tz must be a string"),
    ({"kind": "k", "every": "5m", "overlap": "sometimes"}, "overlap"),
    ({"kind": "k", "every": "5m", "misfire": 3}, "misfire must be a string"),
    ({"kind": "k", "every": "5m", "end": "2020-01-01T00:00:00Z"}, "in the past"),
    ({"kind": "k", "every": "5m", "start": "soon"}, "start"),
    ({"kind": "k", "every": "5m", "priority": "5"}, "priority"),
    ({"kind": "k", "every": "5m", "jitter": {}}, "jitter must be a duration"),
    ({"kind": "k", "every": "5m", "catchup_window": -1}, "catchup_window"),
    ({"kind": "k", "every": "5m", "catchup_window": 10**30}, "ten years"),
    ({"kind": "k", "every": "5m", "jitter": 10**30}, "jitter"),
    ({"kind": "k", "every": "5m", "colour": "red"}, "unknown field(s) 'colour'"),
    ([], "must be a JSON object"),
]


def test_a_bad_schedule_is_400_and_nothing_is_written(api: Api):
    for body, says in BAD_SCHEDULES:
        answered = api.call("admin", "PUT", "/v1/schedules/s1", body)
        one_error(answered, 400, says)
        assert "--" not in answered.json()["error"], "over HTTP a message names fields, not CLI flags"
        one_error(api.call("admin", "GET", "/v1/schedules/s1"), 404)


def test_dead_letters_are_listed_by_pages_and_replayed(api: Api):
    client = api.client
    for i in range(5):
        client.schedule(f"dead{i}", LATER, "payment", {"i": i})
        client.store.record_dead(client.get(f"dead{i}"), f"HTTP 500 ({i})", client.clock.now_ms())
    first = api.call("reader", "GET", "/v1/dead", params={"limit": "3"}).json()
    assert len(first["dead"]) == 3 and first["next"] == first["dead"][-1]["job_id"]
    rest = api.call("reader", "GET", "/v1/dead", params={"after": first["next"], "limit": "3"}).json()
    assert len(rest["dead"]) == 2 and rest["next"] is None
    rows = first["dead"] + rest["dead"]
    assert sorted(r["job_id"] for r in rows) == [f"dead{i}" for i in range(5)]
    assert set(rows[0]) == {"job_id", "kind", "due_at", "attempts", "error", "died_at"}
    replayed = api.call("admin", "POST", "/v1/dead/dead1/replay")
    assert replayed.status_code == 200 and replayed.json()["status"] == "pending"
    assert replayed.json()["replays"][0]["error"] == "HTTP 500 (1)"
    later = (LATER + timedelta(hours=1)).isoformat()
    at = api.call("admin", "POST", "/v1/dead/dead2/replay", {"at": later})
    # A move would arm a dead job again: that is the admin's replay, not the producer's PATCH.
    for role in ("producer", "admin"):
        one_error(api.call(role, "PATCH", "/v1/jobs/dead4", {"at": later}), 409, "replay")
    assert api.call("reader", "GET", "/v1/jobs/dead4").json()["status"] == "dead"
    assert at.json()["due_at"] == later
    one_error(api.call("admin", "POST", "/v1/dead/dead1/replay"), 404, "not in the dead letters")
    one_error(api.call("admin", "POST", "/v1/dead/dead3/replay", {"when": later}), 400, "unknown field")
    assert len(api.call("reader", "GET", "/v1/dead").json()["dead"]) == 3
    for limit in ("0", "1001", "x", "-1", "9" * 5000, "1.5"):
        one_error(api.call("reader", "GET", "/v1/dead", params={"limit": limit}), 400, "limit")


def test_health_readiness_openapi_and_metrics_are_open(api: Api):
    assert api.call(None, "GET", "/healthz").json() == {"status": "ok"}
    assert api.call(None, "GET", "/readyz").json() == {"status": "ready"}
    assert api.call(None, "GET", "/openapi.json").json()["openapi"].startswith("3.")
    api.call("producer", "POST", "/v1/jobs", job("counted"))
    api.call("reader", "GET", "/v1/jobs/counted")
    api.call("reader", "GET", "/v1/jobs/missing")
    one_error(api.call(None, "GET", "/v1/nothing"), 404)
    one_error(api.call("admin", "PUT", "/v1/jobs"), 405)
    text = api.call(None, "GET", "/metrics").text
    assert 'scheduler_api_requests_total{code="201",method="POST",route="/v1/jobs"} 1.0' in text
    assert 'scheduler_api_requests_total{code="404",method="GET",route="/v1/jobs/{id:path}"} 1.0' in text
    assert 'scheduler_api_requests_total{code="405",method="PUT",route="unmatched"} 1.0' in text
    assert 'scheduler_api_jobs_total{status="201"} 1.0' in text
    assert "scheduler_api_request_duration_seconds_bucket" in text and "counted" not in text


@pytest.fixture
def unreachable(store_kind: str, request: Any, tmp_path: Path) -> Iterator[tuple[Store, Any, Any]]:
    """(the API's store, cut, restore): the store made unreachable for the API alone. The
    embedded store's file is moved away and back; Cassandra is reached through a fault
    proxy that is cut (silence, as in a partition), never stopped: other tests share it."""
    store: Store = make_store(store_kind, request, tmp_path, SchemaOptions(shard_count=4))
    if store_kind == "sqlite":
        path, away = tmp_path / "store.db", tmp_path / "away.db"
        yield store, lambda: path.rename(away), lambda: away.rename(path)
        store.close()
        return
    from scheduler.store.cassandra.store import CassandraStore
    from tests.conftest import CASSANDRA_HOSTS, CASSANDRA_PORT
    from tests.faultproxy import FaultProxy

    proxy = FaultProxy(CASSANDRA_HOSTS.split(",")[0], CASSANDRA_PORT)
    url = store.url.replace(f":{CASSANDRA_PORT}/", f":{proxy.port}/")
    assert url != store.url
    through = CassandraStore(url, request_timeout_s=2, connect_timeout_s=2)
    yield through, proxy.cut, proxy.restore
    through.close()
    proxy.close()
    store.close()


def test_the_store_unreachable_while_the_api_runs_is_503_then_the_same_api_answers(unreachable: Any):
    store, cut, restore = unreachable
    client = Client(store, retry_s=0.5)
    api = Api(client)
    try:
        assert api.call("producer", "POST", "/v1/jobs", job("before")).status_code == 201
        cut()
        one_error(api.call("producer", "POST", "/v1/jobs", job("during")), 503)
        one_error(api.call("reader", "GET", "/v1/jobs/before"), 503)
        ready = api.call(None, "GET", "/readyz")
        one_error(ready, 503)
        # Anyone may ask: the answer names no file, node or driver error.
        assert ready.json() == {"error": "the store did not answer: retry after 2 s (the API's log has "
                                         "the cause)"}, ready.text
        batch = api.call("producer", "POST", "/v1/jobs/batch", {"jobs": [job("during")]})
        one_error(batch, 503)
        assert api.call(None, "GET", "/healthz").status_code == 200, "the process itself is alive"
        # Refusals need no store.
        one_error(api.call(None, "POST", "/v1/jobs", job("during")), 401)
        restore()
        wait_until(lambda: api.call(None, "GET", "/readyz").status_code == 200, 60, "the store to answer")
        again = api.call("producer", "POST", "/v1/jobs", job("during"))  # the same request: safe
        assert again.status_code == 201, again.text
        assert api.call("reader", "GET", "/v1/jobs/before").status_code == 200
        assert set(client.store.get_many(["before", "during"])) == {"before", "during"}
        text = api.call(None, "GET", "/metrics").text
        assert 'scheduler_api_requests_total{code="503",method="POST",route="/v1/jobs"} 1.0' in text
    finally:
        restore_quietly(restore)
        client.close()


def restore_quietly(restore: Any) -> None:
    """Undo a cut the test may have left (a failed assertion between cut and restore);
    the file already back is fine."""
    with contextlib.suppress(OSError):
        restore()


def test_an_incoming_traceparent_is_stored_with_the_job(api: Api):
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    r = api.call("producer", "POST", "/v1/jobs", job(), headers={"traceparent": tp})
    assert r.status_code == 201, r.text
    assert api.client.get("j1").traceparent == tp
    bad = api.call("producer", "POST", "/v1/jobs", job("j2"), headers={"traceparent": "00-zz"})
    assert bad.status_code == 201 and api.client.get("j2").traceparent is None, "a bad header is ignored"
