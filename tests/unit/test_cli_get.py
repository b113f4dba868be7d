"""``scheduler get`` in a subprocess on the embedded store: the payload, the attempts, the
last error, the fired time and the replays, as text and as JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from scheduler import Client
from scheduler.store import open_store
from tests.unit.test_cli import run


def test_get_shows_payload_attempts_last_error_and_replays(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/get.db"
    assert run("schema", "apply", store=url).returncode == 0
    store = open_store(url)
    try:
        client = Client(store)
        job = client.schedule("g1", datetime.now(UTC) + timedelta(days=1), "email", {"to": "x@example.com"})
        store.record_dead(job, "ValueError: bad address", job.fire_ms)
        client.replay_dead(["g1"], datetime.now(UTC) + timedelta(days=2))
    finally:
        store.close()
    res = run("get", "g1", "--json", store=url)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["payload"] == {"to": "x@example.com"} and data["payload_encoding"] == "json"
    assert data["status"] == "pending" and data["attempts"] == 0 and data["fired_at"] is None
    assert data["last_error"] == "ValueError: bad address"
    [replay] = data["replays"]
    assert replay["attempts"] == 1 and replay["error"] == "ValueError: bad address"
    text = run("get", "g1", store=url)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert 'payload     {"to": "x@example.com"}' in lines and "attempts    0" in lines
    assert "last_error  ValueError: bad address" in lines and "fired_at    -" in lines
    assert any(ln.startswith("history     replayed from dead letter at ") and
               ln.endswith("after 1 attempt: ValueError: bad address)") for ln in lines), lines
