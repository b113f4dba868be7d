"""Tracing's switches and hooks: the standard variables (bad ones are one line that never
shows the endpoint, which may hold a credential), nothing imported or changed without an
endpoint or without the OpenTelemetry packages, the exporter set up when both are there,
and the hooks the HTTP API and HTTP targets call."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.errors import ConfigError
from scheduler.observe import tracing
from scheduler.observe.attempts import text
from scheduler.settings import TracingSettings, tracing_settings

ROOT = Path(__file__).resolve().parents[2]
INCOMING = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
SECRET = "s3cret-t0ken-in-the-url"
# Prepended to a child's script: every import of OpenTelemetry fails, as when the
# tracing extra is not installed.
BLOCK = """
import sys
class NoOtel:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoOtel())
"""
# A job scheduled and fired on the embedded store; prints what the child saw as JSON.
FIRE = """
import json, logging, sys, tempfile, time
from datetime import UTC, datetime
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from scheduler import App, Client
from scheduler.observe import tracing
from scheduler.observe.attempts import text
from scheduler.poller import Poller, PollerConfig
from scheduler.settings import Settings
from scheduler.store import SchemaOptions, open_store
d = tempfile.mkdtemp()
st = open_store(f"sqlite:///{d}/s.db")
st.apply_schema(SchemaOptions(shard_count=2), int(time.time() * 1000))
client = Client(st, settings=Settings(nudge=False))
job = client.schedule("j", datetime.now(UTC), "k")
with tracing.incoming("INCOMING"):
    passed = client.schedule("p", datetime.now(UTC), "k")
seen = []
poller = Poller(st, App.for_function(lambda j: seen.append(tracing.outgoing_traceparent(j))),
                config=PollerConfig(check_clock=False))
poller.start(range(2))
end = time.monotonic() + 30
while poller.stats.fired < 2 and time.monotonic() < end:
    time.sleep(0.02)
poller.stop()
print(json.dumps({"fired": poller.stats.fired, "stored": [job.traceparent, passed.traceparent],
                  "outgoing": sorted(x or "" for x in seen), "active": tracing.active(),
                  "otel": sorted(m for m in sys.modules if m.startswith("opentelemetry"))}))
""".replace("INCOMING", INCOMING)


def child(script: str, env: dict[str, str]) -> tuple[dict[str, Any], str]:
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SCHEDULER_"))}


# --- the variables ---------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "want"), [
    ({}, TracingSettings(True, None, "http/protobuf")),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
     TracingSettings(True, "http://c:4318/v1/traces", "http/protobuf", "http://c:4318/v1/traces")),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c/base/", "OTEL_EXPORTER_OTLP_PROTOCOL": " HTTP/Protobuf "},
     TracingSettings(True, "https://c/base/v1/traces", "http/protobuf", "https://c/base/v1/traces")),
    # The traces endpoint is used as given, and wins.
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
     TracingSettings(True, "http://t:1/x", "http/protobuf", "http://t:1/x")),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
     TracingSettings(True, "c:4317", "grpc", "(set)")),
    ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
     TracingSettings(True, None, "http/json")),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "SCHEDULER_TRACING": "off"},
     TracingSettings(False, "http://c:4318/v1/traces", "http/protobuf", "http://c:4318/v1/traces")),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"},
     TracingSettings(False, "http://c:4318/v1/traces", "http/protobuf", "http://c:4318/v1/traces")),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"},
     TracingSettings(False, "http://c:4318/v1/traces", "http/protobuf", "http://c:4318/v1/traces")),
    # Credentials and a query never reach the shown form (a log line).
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://u:{SECRET}@[::1]:4318/?k={SECRET}"},
     TracingSettings(True, f"http://u:{SECRET}@[::1]:4318/v1/traces?k={SECRET}", "http/protobuf",
                     "http://[::1]:4318/v1/traces")),
])
def test_the_standard_variables(env, want):
    assert tracing_settings(env) == want


@pytest.mark.parametrize("env", [
    {"OTEL_EXPORTER_OTLP_ENDPOINT": f"collector:4318/{SECRET}"},
    {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://u:{SECRET}@c:99999"},
    {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"ftp://c/{SECRET}"},
    {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://[{SECRET}"},
    {"OTEL_EXPORTER_OTLP_PROTOCOL": "udp"},
    {"SCHEDULER_TRACING": "maybe"},
])
def test_bad_variables_are_one_line_without_the_endpoint(env):
    with pytest.raises(ConfigError) as err:
        tracing_settings(env)
    assert SECRET not in str(err.value) and "\n" not in str(err.value)


@pytest.mark.fuzz
@given(st.dictionaries(st.sampled_from(["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                                        "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                                        "SCHEDULER_TRACING", "OTEL_SDK_DISABLED"]),
                       st.one_of(st.text(max_size=40), st.sampled_from(
                           ["http://c:4318", "https://[::1]:1/p", "grpc", "http/protobuf", "off", "http://:0",
                            "http://c:x", "http://[::1", "HTTP://C", " ", ""]))))
def test_any_variables_give_settings_or_one_config_error(env):
    try:
        got = tracing_settings(env)
    except ConfigError as exc:
        text = str(exc)
        assert "\n" not in text
        name = text.split(" ")[0]
        if name.endswith("_ENDPOINT"):  # the same line whatever the value: it is never shown
            assert text == (f"{name} is not an http:// or https:// URL (its value is not shown: it may hold "
                            "a credential); give the collector's, e.g. http://collector:4318")
        return
    assert got.protocol in ("http/protobuf", "grpc", "http/json")
    if got.endpoint is not None and got.protocol != "grpc":
        assert got.shown.startswith(("http://", "https://")) and "@" not in got.shown


# --- off: nothing imported, nothing changed --------------------------------------------------


def test_without_an_endpoint_nothing_is_traced_and_opentelemetry_is_not_imported():
    seen, log = child(FIRE, base_env())
    assert seen["fired"] == 2 and not seen["active"] and seen["otel"] == []
    # Nothing stored but the incoming request's context, which is passed through.
    assert seen["stored"] == [None, INCOMING] and seen["outgoing"] == ["", INCOMING]
    assert "tracing" not in log


def test_without_opentelemetry_installed_an_endpoint_changes_nothing_but_one_warning():
    env = {**base_env(), "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_HEADERS":
           f"authorization=Bearer {SECRET}"}
    seen, log = child(BLOCK + FIRE, env)
    assert seen["fired"] == 2 and not seen["active"] and seen["otel"] == []
    assert seen["stored"] == [None, INCOMING] and seen["outgoing"] == ["", INCOMING]
    assert log.count("cannot be imported: install scheduler[tracing]; tracing stays off") == 1
    assert SECRET not in log


def test_every_module_imports_without_opentelemetry():
    script = BLOCK + """
import importlib, json, pkgutil, scheduler
# (The console and the API need extras of their own; __main__ runs the CLI.)
names = [m.name for m in pkgutil.walk_packages(scheduler.__path__, "scheduler.")]
for name in names:
    if not name.startswith(("scheduler.console", "scheduler.api", "scheduler.__main__")):
        importlib.import_module(name)
print(json.dumps({"n": len(names), "otel": [m for m in sys.modules if m.startswith("opentelemetry")]}))
"""
    seen, _ = child(script, base_env())
    assert seen["n"] > 50 and seen["otel"] == []


def test_scheduler_tracing_off_wins_over_an_endpoint():
    env = {**base_env(), "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "SCHEDULER_TRACING": "off"}
    seen, _ = child(FIRE, env)
    assert not seen["active"] and seen["otel"] == [] and seen["stored"] == [None, INCOMING]


# --- on: the exporter --------------------------------------------------------------------------


def test_an_endpoint_sets_up_a_batch_exporter_of_our_own():
    try:
        assert tracing.setup(TracingSettings(True, "http://127.0.0.1:9/v1/traces", "http/protobuf",
                                             "http://127.0.0.1:9/v1/traces"))
        on = tracing._on
        assert on is not None and on.owned
        [processor] = on.provider._active_span_processor._span_processors
        assert type(processor).__name__ == "BatchSpanProcessor"
        assert on.provider.resource.attributes["service.name"] == "scheduler"
        assert tracing.setup(TracingSettings())  # already on: stays on
    finally:
        tracing.shutdown()
    assert not tracing.active()


def test_a_protocol_without_an_exporter_warns_once_and_stays_off(caplog):
    config = TracingSettings(True, "http://127.0.0.1:9/v1/traces", "http/json", "x")
    tracing._warned.discard("http/json")  # whatever another test of this process did
    with caplog.at_level("WARNING", logger="scheduler.tracing"):
        assert not tracing.setup(config) and not tracing.setup(config)
    assert [r.getMessage() for r in caplog.records].count(
        "OTLP protocol http/json has no exporter for Python: set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf; "
        "tracing stays off") == 1
    assert not tracing.active()


def test_an_application_provider_is_used_as_it_is():
    script = """
import json
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from scheduler.observe import tracing
from scheduler.observe.attempts import text
from scheduler.settings import TracingSettings
mine = TracerProvider()
trace.set_tracer_provider(mine)
on = tracing.setup(TracingSettings(True, "http://127.0.0.1:9/v1/traces", "http/protobuf", "x"), process=True)
print(json.dumps({"on": on, "same": tracing._on.provider is mine, "owned": tracing._on.owned}))
"""
    seen, _ = child(script, base_env())
    assert seen == {"on": True, "same": True, "owned": False}


# --- the hooks of the HTTP API and HTTP targets ----------------------------------------------


def run_asgi(headers: list[tuple[bytes, bytes]], scope_type: str = "http") -> list[str | None]:
    seen: list[str | None] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(tracing.outgoing_traceparent())

    asyncio.run(tracing.TraceparentMiddleware(app)({"type": scope_type, "headers": headers}, None, None))
    return seen


def test_the_middleware_takes_one_valid_traceparent_header():
    assert run_asgi([(b"traceparent", INCOMING.encode())]) == [INCOMING]
    assert run_asgi([(b"Traceparent", INCOMING.encode())]) == [INCOMING]
    assert run_asgi([(b"traceparent", INCOMING.encode()), (b"traceparent", INCOMING.encode())]) == [None]
    assert run_asgi([(b"traceparent", b"\xff\x00garbage")]) == [None]
    assert run_asgi([(b"traceparent", INCOMING.encode())], "lifespan") == [None]
    assert tracing.outgoing_traceparent() is None  # nothing left behind


def test_an_attribute_that_utf8_cannot_carry_is_mended():
    assert text("kind\udc80") == "kind?"
    assert text("x" * 1000) == "x" * 512


def test_a_malformed_header_is_logged_without_its_value():
    # The SDK warns about an entry of OTEL_EXPORTER_OTLP_HEADERS it cannot parse by
    # quoting it: here the entry is a token.
    script = """
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from scheduler.observe import tracing
print(json.dumps({"on": tracing.setup(process=True)}))
tracing.shutdown()
"""
    env = {**base_env(), "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
           "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization Bearer {SECRET}"}
    seen, log = child(script, env)
    assert seen == {"on": True}
    assert "Header format invalid" in log and "not shown" in log and SECRET not in log
