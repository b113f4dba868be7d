"""The parts of ``scheduler api`` that need no server: the tokens file and the bearer
check, the bounded body reader and the JSON parser, the job comparison behind 409, the
status of each typed error, the OpenAPI document against the routes (and its copy in
the docs), and the embedded store's refusal while its file is away."""

from __future__ import annotations

import asyncio
import hmac
import json
import re
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, cast

import pytest
from starlette.requests import Request
from starlette.routing import Route

from scheduler.api import openapi
from scheduler.api.body import MAX_BODY_BYTES, parse_json, read_body, too_deep
from scheduler.api.jobs import same_job
from scheduler.api.respond import ApiError, status_of
from scheduler.api.tokens import Caller, Permission
from scheduler.domain.model import Job
from scheduler.errors import (
    ConfigError,
    InvalidInput,
    JobNotFound,
    PermissionDenied,
    ScheduleConflict,
    ScheduleNotFound,
    SchemaError,
    StoreUnavailable,
    WriteTimeout,
)
from scheduler.settings import api_tokens
from tests.apihelp import ROUTES, TOKENS, tokens

ROOT = Path(__file__).resolve().parents[2]


# --- the tokens file and the bearer check ----------------------------------------------


def test_the_tokens_file_skips_comments_and_blank_lines_and_reads_crlf(tmp_path: Path):
    path = tmp_path / "tokens"
    path.write_bytes(b"# who may call\r\n\r\nadmin  aaaaaaaaaaaaaaaa\r\n  reader\tbbbbbbbbbbbbbbbb-!~\n")
    assert api_tokens({"SCHEDULER_API_TOKENS_FILE": str(path)}) == [
        ("admin", "aaaaaaaaaaaaaaaa", 3), ("reader", "bbbbbbbbbbbbbbbb-!~", 4)]


def test_each_role_may_what_its_row_says_and_no_more():
    known = tokens()
    callers = {role: known.caller(f"Bearer {token}") for role, token in TOKENS.items()}
    assert {role: c.role for role, c in callers.items() if c} == {r: r for r in TOKENS}
    may = {role: {p for p in Permission if c is not None and c.may(p)} for role, c in callers.items()}
    assert may == {"reader": {Permission.READ}, "producer": {Permission.READ, Permission.WRITE_JOBS},
                   "admin": set(Permission)}
    assert callers["admin"] == Caller("admin", 4) and callers["admin"].name == "admin@line4"


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", "Basic abc", f"Token {TOKENS['admin']}",
                                    f"Bearer {TOKENS['admin']} x", "Bearer \udcff", "Bearer " + "x" * 10_000])
def test_anything_but_a_known_bearer_token_is_nobody(header: str | None):
    assert tokens().caller(header) is None


def test_every_token_is_compared_every_time_in_constant_time(monkeypatch: pytest.MonkeyPatch):
    """No early exit on a match and no comparison of the token itself: one
    ``compare_digest`` of two SHA-256 digests per configured token, whichever matches."""
    seen: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        seen.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    known = tokens()
    for header in (f"Bearer {TOKENS['reader']}", f"Bearer {TOKENS['admin']}", "Bearer nobody-at-all-here"):
        seen.clear()
        known.caller(header)
        assert seen == [(32, 32)] * len(TOKENS)


# --- bodies ----------------------------------------------------------------------------


def request_of(chunks: list[bytes], headers: dict[str, str] | None = None) -> tuple[Request, list[int]]:
    """A request whose body arrives in ``chunks``; the list counts the chunks read."""
    pulled: list[int] = []
    messages = iter(chunks)

    async def receive() -> MutableMapping[str, Any]:
        chunk = next(messages, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        pulled.append(len(chunk))
        return {"type": "http.request", "body": chunk, "more_body": True}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [
        (k.encode(), v.encode()) for k, v in (headers or {}).items()]}
    return Request(scope, receive), pulled


def test_a_body_is_read_no_further_than_one_chunk_past_the_limit():
    chunk = b" " * 65536
    request, pulled = request_of([chunk] * 100)
    with pytest.raises(ApiError) as refused:
        asyncio.run(read_body(request))
    assert refused.value.status == 413
    assert sum(pulled) <= MAX_BODY_BYTES + len(chunk)
    request, pulled = request_of([chunk] * 100, {"content-length": str(100 * len(chunk))})
    with pytest.raises(ApiError):
        asyncio.run(read_body(request))
    assert pulled == [], "a Content-Length over the limit: not a byte read"
    request, _ = request_of([chunk] * 16)
    assert len(asyncio.run(read_body(request))) == MAX_BODY_BYTES


@pytest.mark.parametrize("raw", [b"\xff", b"NaN", b"-Infinity", b"1e999", b"[1,]", b"{'a': 1}", b"\x00",
                                 b"[" * 5000, b"9" * 5000, b'"\\ud800', b"\xef\xbb\xbf[]", b"",
                                 b'{"a": 1} {"b": 2}'])
def test_anything_but_strict_json_is_a_400(raw: bytes):
    with pytest.raises(ApiError) as refused:
        parse_json(raw)
    assert refused.value.status == 400 and "\n" not in str(refused.value)


def test_nesting_is_measured_without_recursion():
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    assert too_deep(deep) and not too_deep([[[]]], limit=3) and too_deep([[[[]]]], limit=3)
    assert parse_json(b"[" * 64 + b"]" * 64) is not None
    assert parse_json(b"  ", empty=None) is None


# --- what makes a job the same ---------------------------------------------------------


def job(**changes: Any) -> Job:
    base = Job(job_id="j", kind="k", data=b'{"a":1,"b":[1,2]}', data_json=True, due_ms=1_900_000_000_000,
               fire_ms=1_900_000_000_000, bucket=31_666_666, shard=3, priority=5, key=None)
    return base._replace(**changes)


def test_the_same_job_is_the_same_whatever_its_placement_and_key_order():
    assert same_job(job(), job(fire_ms=1_900_000_003_000, shard=1, bucket=1))
    assert same_job(job(), job(data=b'{"b": [1, 2], "a": 1}'))
    for other in (job(kind="x"), job(due_ms=1), job(priority=9), job(key="k"),
                  job(data=b'{"a":1.0,"b":[1,2]}'), job(data=b'{"a":true,"b":[1,2]}'), job(data_json=False),
                  job(data=b"not json")):
        assert not same_job(job(), other), other


# --- errors and their statuses -----------------------------------------------------------


def test_each_typed_error_has_its_status():
    assert [status_of(e) for e in (InvalidInput(), JobNotFound(), ScheduleNotFound(), ScheduleConflict(),
                                   StoreUnavailable(), WriteTimeout(), SchemaError(), PermissionDenied(),
                                   ConfigError())] == [400, 404, 404, 409, 503, 503, 503, 503, 503]


# --- the OpenAPI document ----------------------------------------------------------------


def test_the_document_describes_exactly_the_routes():
    doc = openapi.document()
    described = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert described == set(ROUTES)
    from scheduler.api.app import build

    app = build(cast(Any, None), tokens())  # the client is used by requests only
    routes = [r for r in app.routes if isinstance(r, Route)]
    served = {(m, re.sub(r":\w+}", "}", r.path)) for r in routes for m in r.methods or () if m != "HEAD"}
    assert served == set(ROUTES)
    for (method, path), least in ROUTES.items():
        op = doc["paths"][path][method.lower()]
        assert bool(op["security"]) == (least is not None), path
        if least is not None:
            assert {"401", "403"} <= set(op["responses"]) and f"role {least}" in op["summary"]
        error = {"$ref": "#/components/schemas/Error"}
        for status, answer in op["responses"].items():
            if status.startswith(("4", "5")):
                assert answer["content"]["application/json"]["schema"] == error


def test_the_docs_hold_the_document_as_served():
    """docs/openapi.json is the document, written by ``python -m scheduler.api.openapi``."""
    assert (ROOT / "docs" / "openapi.json").read_text() == openapi.text()
    json.loads(openapi.text())


# --- the embedded store's file ---------------------------------------------------------


def test_the_embedded_store_refuses_while_its_file_is_away_and_not_a_replacement(tmp_path: Path):
    from scheduler.store import SchemaOptions, open_store

    path = tmp_path / "s.db"
    store = open_store(f"sqlite:///{path}")
    store.apply_schema(SchemaOptions(), 1_800_000_000_000)
    other = open_store(f"sqlite:///{tmp_path}/other.db")
    other.apply_schema(SchemaOptions(), 1_800_000_000_000)
    other.close()
    try:
        path.rename(tmp_path / "away.db")
        with pytest.raises(StoreUnavailable, match="is gone"):
            store.meta()
        with pytest.raises(StoreUnavailable, match="is gone"):
            store.get("x")
        (tmp_path / "away.db").rename(path)
        assert store.meta().bucket_width_s == 60
        (tmp_path / "other.db").replace(path)  # another store restored in its place
        with pytest.raises(StoreUnavailable, match="restart the process"):
            store.meta()
    finally:
        store.close()
