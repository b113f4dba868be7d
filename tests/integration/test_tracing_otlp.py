"""Spans exported over OTLP/HTTP (protobuf) by real processes, configured by the standard
variables only: ``scheduler schedule`` exports its producer span when it exits, and a
``scheduler run`` poller the attempt's span, a child of it, when it stops (both batch
their spans for a minute, so what arrives was flushed on the way out). The exporter sends
OTEL_EXPORTER_OTLP_HEADERS, and no process prints them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from scheduler.domain.clock import SystemClock
from scheduler.store import SchemaOptions, open_store
from tests.handlers import read_records
from tests.procs import ROOT, start_poller, wait_until

TOKEN = "Bearer otlp-secret-7f3a9c"


class Receiver:
    """A collector's OTLP/HTTP traces endpoint: POST /v1/traces with a protobuf body."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.refused: list[str] = []
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    received.refused.append(f"{self.path} {self.headers.get('Content-Type')}")
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                received.auth.append(self.headers.get("Authorization"))
                for rs in request.resource_spans:
                    service = {a.key: a.value.string_value for a in rs.resource.attributes}["service.name"]
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            received.spans.append({
                                "name": s.name, "trace": s.trace_id.hex(), "span": s.span_id.hex(),
                                "parent": s.parent_span_id.hex(), "service": service,
                                "attrs": {a.key: a.value.string_value or a.value.int_value
                                          for a in s.attributes}})
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def named(self, name: str) -> list[dict[str, Any]]:
        return [s for s in self.spans if s["name"] == name]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def test_producer_and_poller_processes_export_one_trace_over_otlp_http(receiver, tmp_path):
    url = f"sqlite:///{tmp_path}/store.db"
    store = open_store(url)
    store.apply_schema(SchemaOptions(shard_count=4), SystemClock().now_ms())
    store.close()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
           "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
           "OTEL_EXPORTER_OTLP_HEADERS": f"authorization={TOKEN.replace(' ', '%20')}",
           # Batches wait a minute: only the flush on exit can send them in time.
           "OTEL_BSP_SCHEDULE_DELAY": "60000", "SCHEDULER_STORE": url, "SCHEDULER_NUDGE": "off"}
    due = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    made = subprocess.run([sys.executable, "-m", "scheduler", "schedule", "--id", "otlp-1", "--at", due,
                           "--kind", "record", "--json"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    wait_until(lambda: bool(receiver.named("scheduler.schedule")), 30, "the producer's span")
    [produced] = receiver.named("scheduler.schedule")
    assert produced["attrs"] == {"scheduler.job.id": "otlp-1", "scheduler.job.kind": "record"}
    assert produced["service"] == "scheduler"

    out = tmp_path / "fired.log"
    proc = start_poller(url, out, env=env)
    try:
        wait_until(lambda: len(read_records(str(out))) == 1, 60, "the job to fire")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    log = Path(f"{out}.log").read_text()
    assert proc.returncode == 0, log[-2000:]
    wait_until(lambda: bool(receiver.named("scheduler.attempt")), 30, "the attempt's span")
    [attempt] = receiver.named("scheduler.attempt")
    assert (attempt["trace"], attempt["parent"]) == (produced["trace"], produced["span"])
    assert attempt["attrs"]["scheduler.job.outcome"] == "fired"
    assert attempt["attrs"]["scheduler.job.attempt"] == 1
    assert attempt["attrs"]["scheduler.job.kind"] == "record"
    assert not receiver.refused and receiver.auth and set(receiver.auth) == {TOKEN}
    assert '"action": "tracing_on"' in log and f"{receiver.url}/v1/traces" in log
    for text in (log, made.stdout, made.stderr):
        assert "otlp-secret" not in text
