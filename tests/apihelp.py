"""Helpers for the tests of ``scheduler api``: a token per role, and a test client that
sends a role's token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from scheduler import Client
from scheduler.api.app import build
from scheduler.api.tokens import Tokens
from scheduler.observe.metrics import ApiMetrics

TOKENS = {
    "reader": "reader-token-0123456789abcdef",
    "producer": "producer-token-0123456789abcdef",
    "admin": "admin-token-0123456789abcdef",
}
# Every route of the contract: (method, path template), and the least role that may call it.
ROUTES = {
    ("POST", "/v1/jobs"): "producer",
    ("POST", "/v1/jobs/batch"): "producer",
    ("GET", "/v1/jobs/{id}"): "reader",
    ("PATCH", "/v1/jobs/{id}"): "producer",
    ("DELETE", "/v1/jobs/{id}"): "producer",
    ("PUT", "/v1/schedules/{id}"): "admin",
    ("GET", "/v1/schedules/{id}"): "reader",
    ("DELETE", "/v1/schedules/{id}"): "admin",
    ("POST", "/v1/schedules/{id}/pause"): "admin",
    ("POST", "/v1/schedules/{id}/resume"): "admin",
    ("GET", "/v1/dead"): "reader",
    ("POST", "/v1/dead/{id}/replay"): "admin",
    ("GET", "/healthz"): None,
    ("GET", "/readyz"): None,
    ("GET", "/openapi.json"): None,
    ("GET", "/metrics"): None,
}
RANK = {None: 0, "reader": 1, "producer": 2, "admin": 3}


def tokens_file(folder: Path) -> Path:
    path = folder / "api-tokens"
    path.write_text("# role token\n" + "".join(f"{role} {token}\n" for role, token in TOKENS.items()))
    return path


def tokens() -> Tokens:
    return Tokens((role, token, n) for n, (role, token) in enumerate(TOKENS.items(), 2))


class Api:
    """A test client of the API over ``client``; ``call(role, method, path, ...)`` sends
    that role's token (``None``: no token)."""

    def __init__(self, client: Client, metrics: ApiMetrics | None = None) -> None:
        self.client = client
        self.metrics = metrics or ApiMetrics()
        self.http = TestClient(build(client, tokens(), self.metrics), raise_server_exceptions=True)

    def call(self, role: str | None, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        headers = dict(kw.pop("headers", {}))
        if role is not None:
            headers["authorization"] = f"Bearer {TOKENS[role]}"
        if body is not None:
            kw["json"] = body
        return self.http.request(method, path, headers=headers, **kw)


def one_error(response: Any, status: int, *says: str) -> str:
    """Assert ``response`` is ``status`` with ``{"error": "one line"}``; its line."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    data = response.json()
    assert set(data) == {"error"} and isinstance(data["error"], str), data
    line = data["error"]
    assert line and "\n" not in line and "Traceback" not in line, line
    for word in says:
        assert word in line, (word, line)
    if status == 503:
        assert int(response.headers["retry-after"]) > 0
    return line
