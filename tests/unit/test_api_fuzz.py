"""Property-based tests of the API's parsing and of every endpoint (hypothesis), through
Starlette's test client on the embedded store.

The properties: the body parser turns any bytes into a value or a 400, nothing else;
whatever the method, path, query, headers and body, an endpoint answers 2xx or 4xx,
never 5xx, and every 4xx is ``{"error": "one line"}``; a tokens file of any text is read
or refused with a message that holds none of its tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler import Client
from scheduler.api.body import parse_json
from scheduler.api.respond import ApiError
from scheduler.errors import ConfigError
from scheduler.settings import api_tokens
from scheduler.store import SchemaOptions, open_store
from tests.apihelp import TOKENS, Api

pytestmark = pytest.mark.fuzz

NOW = datetime.now(UTC).replace(microsecond=0)
text = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
times = st.one_of(st.sampled_from([
    (NOW + timedelta(hours=1)).isoformat(), (NOW - timedelta(days=3)).isoformat(), "2030-01-01T09:00:00Z",
    "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "2030-02-30T00:00:00Z", "2030-01-01", "now", "",
    "2030-01-01T09:00:00+99:00", "\u0662\u0660\u0663\u0660-01-01T00:00:00Z"]), text)
huge = st.sampled_from([2**31, 2**63, -(2**63) - 1, 10**30, 10**400, 1e308, -0.0, 5.0, 1e-320])
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 12), huge, st.floats(allow_nan=False,
                    allow_infinity=False), text, times)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)), max_leaves=12)
ids = st.one_of(st.sampled_from(["j1", "dead0", "nightly", "recurring:x:1:1", "", " ", "a/b", "x" * 300]),
                text)
FIELDS = ["id", "at", "kind", "payload", "priority", "key", "jitter", "cron", "every", "tz", "start", "end",
          "overlap", "misfire", "catchup_window", "jobs", "extra"]
fields = st.dictionaries(st.one_of(st.sampled_from(FIELDS), text), st.one_of(values, times, ids), max_size=8)
# Valid jobs and schedules with one or two fields changed to a value near a limit (a body
# of random fields is refused at its first one and reaches nothing deeper).
big_ints = st.sampled_from([2**31, 2**63 - 1, 2**63, 10**30, 10**400, 315_360_000, 315_360_001, -1, 0])
durations = st.one_of(st.sampled_from(["5m", "0", "1d", "3650d", "3651d", "-1s", "1e3", "5 m"]), big_ints,
                      st.integers(-5, 10**6), scalars)
priorities = st.one_of(st.integers(-1, 10), big_ints, scalars)
keys = st.one_of(st.sampled_from(["k", "", "k" * 256, "k" * 257, "é" * 129, "a\x00"]), text, scalars)


def changed(base: dict[str, Any], choices: dict[str, Any]) -> Any:
    pairs = st.one_of(*[st.tuples(st.just(name), strategy) for name, strategy in choices.items()])
    return st.lists(pairs, max_size=2).map(lambda changes: {**base, **dict(changes)})


job_like = changed({"id": "f1", "at": (NOW + timedelta(hours=3)).isoformat(), "kind": "email"}, {
    "id": ids, "at": times, "kind": st.one_of(st.sampled_from(["sms", "x" * 64, "x" * 65, "1a"]), scalars),
    "payload": values, "priority": priorities, "key": keys, "jitter": st.one_of(durations, huge),
    "extra": values})
SCHEDULE_CHOICES = {
    "kind": st.one_of(st.sampled_from(["other", "x" * 65]), scalars),
    "cron": st.one_of(st.sampled_from(["0 3 * * *", "@daily", "*/5 * * * *", "0 0 30 2 *", "61 * * * *",
                                       "* * * * * *"]), scalars),
    "every": durations, "catchup_window": durations, "jitter": durations,
    "tz": st.one_of(st.sampled_from(["UTC", "Europe/Lisbon", "Europe", "", "Etc/GMT+14"]), text, scalars),
    "start": times, "end": times, "payload": values, "priority": priorities, "key": keys,
    "overlap": st.one_of(st.sampled_from(["allow", "skip", "buffer_one", "ALLOW"]), scalars),
    "misfire": st.one_of(st.sampled_from(["fire_once", "fire_all", "skip", ""]), scalars), "extra": values}
schedule_like = st.one_of(
    changed({"kind": "report", "every": "5m"}, SCHEDULE_CHOICES),
    changed({"kind": "report", "cron": "0 3 * * *", "tz": "Europe/Lisbon"}, SCHEDULE_CHOICES))
bodies = st.one_of(values, fields, job_like, schedule_like, st.builds(lambda js: {"jobs": js}, st.lists(
    st.one_of(job_like, values), max_size=5)))
raw = st.one_of(st.binary(max_size=200), st.builds(lambda v: json.dumps(v).encode(), values),
                st.sampled_from([b"[" * 2000, b'{"a":' * 500, b"\xef\xbb\xbf{}", b'"\\ud800"', b"1e99999",
                                 b'{"jobs": [' + b"{}," * 300 + b"{}]}"]))
PATHS = ["/v1/jobs", "/v1/jobs/batch", "/v1/jobs/{}", "/v1/schedules/{}", "/v1/schedules/{}/pause",
         "/v1/schedules/{}/resume", "/v1/dead", "/v1/dead/{}/replay", "/healthz", "/readyz", "/metrics",
         "/openapi.json", "/{}", "/v1/{}"]
methods = st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE"])
path_ids = st.one_of(ids, text).map(lambda s: "".join(c if c.isprintable() else "_" for c in s) or "x")


@given(data=st.binary(max_size=300))
def test_any_bytes_parse_to_a_value_or_a_400(data: bytes):
    try:
        parse_json(data)
    except ApiError as exc:
        assert exc.status == 400 and "\n" not in str(exc)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    path = tmp_path_factory.mktemp("fuzz") / "store.db"
    store = open_store(f"sqlite:///{path}")
    store.apply_schema(SchemaOptions(shard_count=2), int(NOW.timestamp() * 1000) - 3_600_000)
    client = Client(store, retry_s=0)
    client.schedule("j1", NOW + timedelta(hours=1), "email", {"to": "a"})
    client.schedule("dead0", NOW + timedelta(hours=2), "email")
    store.record_dead(client.get("dead0"), "HTTP 500", client.clock.now_ms())
    client.recurring.create("nightly", kind="report", cron="0 3 * * *", tz="Europe/Lisbon")
    yield Api(client)
    client.close()
    store.close()


def check(response: Any) -> None:
    assert 200 <= response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400 and response.request.method != "HEAD":
        data = response.json()
        assert set(data) == {"error"} and isinstance(data["error"], str) and "\n" not in data["error"], data


@given(method=methods, path=st.sampled_from(PATHS), job_id=path_ids, body=bodies,
       role=st.sampled_from([None, "reader", "producer", "admin"]),
       query=st.dictionaries(st.sampled_from(["after", "limit", "x"]), st.one_of(text, ids), max_size=2))
def test_any_json_to_any_endpoint_is_2xx_or_a_4xx_with_one_line(api: Api, method: str, path: str, job_id: str,
                                                                  body: Any, role: str | None,
                                                                  query: dict[str, str]):
    concrete = path.replace("{}", job_id.replace("?", "_").replace("#", "_"))
    check(api.call(role, method, concrete, body if method not in ("GET", "HEAD") else None, params=query))


CONTENT_TYPES = ["application/json", "text/plain", "", "application/json; charset=latin-1"]


@given(method=st.sampled_from(["POST", "PUT", "PATCH", "DELETE"]), path=st.sampled_from(PATHS), data=raw,
       content_type=st.sampled_from(CONTENT_TYPES))
def test_any_bytes_to_any_endpoint_is_2xx_or_a_4xx_with_one_line(api: Api, method: str, path: str,
                                                                   data: bytes, content_type: str):
    headers = {"content-type": content_type} if content_type else {}
    check(api.call("admin", method, path.replace("{}", "j1"), content=data, headers=headers))


@given(headers=st.dictionaries(st.sampled_from(["authorization", "content-length", "content-type", "x"]),
                               st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60),
                               max_size=3))
def test_any_headers_are_2xx_or_a_4xx(api: Api, headers: dict[str, str]):
    check(api.call(None, "GET", "/v1/jobs/j1", headers=headers))
    if "content-length" not in headers:
        check(api.call(None, "POST", "/v1/jobs", content=b"{}", headers=headers))


tokens16 = st.text(st.sampled_from("0123456789abcdef"), min_size=16, max_size=24)
lines = st.one_of(
    st.builds(lambda r, t: f"{r} {t}", st.sampled_from(["admin", "reader", "producer", "writer", ""]),
              tokens16),
    st.builds(lambda t, r: f"{t} {r}", tokens16, st.sampled_from(["admin", "x"])),
    st.builds(lambda t: t, tokens16), text, st.just(""), st.just("# comment"))


@given(content=st.lists(lines, max_size=6), bad_bytes=st.booleans())
def test_a_tokens_file_is_read_or_refused_without_showing_a_token(tmp_path_factory: pytest.TempPathFactory,
                                                                   content: list[str], bad_bytes: bool):
    path: Path = tmp_path_factory.mktemp("tokens") / "tokens"
    data = "\n".join(content).encode("utf-8", "surrogatepass") + (b"\n\xff" if bad_bytes else b"")
    path.write_bytes(data)
    try:
        found = api_tokens({"SCHEDULER_API_TOKENS_FILE": str(path)})
    except ConfigError as exc:
        message = str(exc).replace(str(path), "")
        for line in content:
            for word in line.split():
                if len(word) >= 16:
                    assert word not in message, (word, message)
        assert "\n" not in message
        return
    assert found and all(role in TOKENS and len(token) >= 16 for role, token, _ in found)


@given(body=schedule_like, verb=st.sampled_from(["PUT", "PUT", "DELETE", "POST pause", "POST resume"]))
def test_any_schedule_definition_is_2xx_or_a_4xx(api: Api, body: dict[str, Any], verb: str):
    method, _, action = verb.partition(" ")
    check(api.call("admin", method, "/v1/schedules/s" + (f"/{action}" if action else ""),
                   body if method == "PUT" else None))


@given(jobs=st.lists(job_like, min_size=1, max_size=4), verb=st.sampled_from(["POST", "batch", "PATCH"]))
def test_any_job_is_2xx_or_a_4xx(api: Api, jobs: list[dict[str, Any]], verb: str):
    if verb == "batch":
        check(api.call("producer", "POST", "/v1/jobs/batch", {"jobs": jobs}))
    elif verb == "POST":
        check(api.call("producer", "POST", "/v1/jobs", jobs[0]))
    else:
        check(api.call("producer", "PATCH", "/v1/jobs/j1", {"at": jobs[0]["at"]}))
