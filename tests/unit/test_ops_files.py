"""The ops files agree with the code: alert rules (checked and unit-tested by promtool),
the Grafana dashboard, the runbook, and docker-compose.yml (which cannot run here: no
Docker engine) against the ops scripts and the CLI."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any, cast

import click
import pytest
import yaml
from typer.main import get_command

from scheduler.domain.clock import FakeClock
from scheduler.observe.audit import AuditReport
from scheduler.observe.exporter import LagExporter
from scheduler.observe.metrics import PollerMetrics

ROOT = Path(__file__).parents[2]
PROM = ROOT / "ops" / "prometheus"
GRAFANA = ROOT / "ops" / "grafana"
REQUIRED_ALERTS = {"SchedulerShardLagHigh", "SchedulerShardUnowned", "SchedulerBacklogGrowing",
                   "SchedulerExporterAbsent", "SchedulerFencingRefusals", "SchedulerClockSkew"}


def exposed_metric_names() -> set[str]:
    """Every series name the pollers and the exporter can expose."""
    names: set[str] = set()
    exporter = LagExporter(cast(Any, None), FakeClock(), audit_interval_s=600)
    exporter._audit = (AuditReport(0, 0), 0.0, 0.0)  # after an audit (--audit-interval)
    exporter._members = 3  # as after a refresh with ZooKeeper: the fleet gauge appears
    exporter._recurring = {"active": 1, "paused": 0, "broken": 0}  # after a recurring check
    registries = [PollerMetrics().registry, exporter.registry]
    for registry in registries:
        for family in registry.collect():
            names.add(family.name)
            if family.type == "counter":
                names.add(family.name + "_total")
            if family.type == "histogram":
                names.update(family.name + s for s in ("_bucket", "_sum", "_count"))
    return names


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((PROM / "alerts.yml").read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def test_promtool_checks_rules_config_and_rule_unit_tests(promtool: str):
    for args in (["check", "rules", "alerts.yml"], ["check", "config", "prometheus.yml"],
                 ["test", "rules", "alerts_test.yml"]):
        res = subprocess.run([promtool, *args], cwd=PROM, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, f"promtool {' '.join(args)}:\n{res.stdout}{res.stderr}"


def test_required_alerts_exist_and_have_runbook_sections():
    by_name = {r["alert"]: r for r in rules()}
    assert set(by_name) >= REQUIRED_ALERTS
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    headings = {re.sub(r"[^a-z0-9-]", "", h.strip().lower().replace(" ", "-"))
                for h in re.findall(r"^## (.+)$", runbook, flags=re.M)}
    for name, rule in by_name.items():
        anchor = rule["annotations"]["runbook_url"].split("#")[1]
        assert anchor in headings, f"{name}: docs/runbook.md has no section #{anchor}"


def test_rules_and_dashboard_only_use_metrics_that_exist():
    exposed = exposed_metric_names() | {"up"}
    exprs = [r["expr"] for r in rules()]
    dash = json.loads((GRAFANA / "dashboard.json").read_text())
    exprs += [t["expr"] for p in dash["panels"] for t in p["targets"]]
    for expr in exprs:
        for name in re.findall(r"\b(scheduler_[a-z_]+)\b", expr):
            assert name in exposed, f"{name} in {expr!r} is not exposed by any collector"


def test_dashboard_has_the_panels_sres_need():
    dash = json.loads((GRAFANA / "dashboard.json").read_text())
    by_type: dict[str, list[str]] = {}
    for p in dash["panels"]:
        by_type.setdefault(p["type"], []).append(" ".join(t["expr"] for t in p["targets"]))
    assert any("scheduler_shard_lag_seconds" in e for e in by_type["heatmap"])
    exprs = " ".join(e for es in by_type.values() for e in es)
    for needle in ("rate(scheduler_jobs_fired_total", "histogram_quantile(0.99",
                   "scheduler_fire_lateness_seconds_bucket", "scheduler_shard_due_backlog"):
        assert needle in exprs


# --- docker-compose.yml -----------------------------------------------------------------


def compose() -> dict[str, Any]:
    return cast(dict[str, Any], yaml.safe_load((ROOT / "docker-compose.yml").read_text()))


def ops_default(script: str, variable: str) -> str:
    m = re.search(rf"^{variable}=\$\{{\w+:-([^}}]+)\}}", (ROOT / "ops" / script).read_text(), flags=re.M)
    assert m, f"ops/{script} has no default {variable}"
    return m.group(1)


def test_compose_has_the_whole_topology():
    services = compose()["services"]
    assert set(services) == {"cassandra", "zookeeper", "schema", "poller-1", "poller-2", "poller-3",
                             "poller-4", "exporter", "console", "api", "api-tokens", "http-signing-secret",
                             "prometheus", "grafana"}


def test_compose_servers_match_the_ops_scripts():
    services = compose()["services"]
    assert services["cassandra"]["image"] == f"cassandra:{ops_default('cassandra', 'VERSION')}"
    assert services["zookeeper"]["image"] == f"zookeeper:{ops_default('zookeeper', 'VERSION')}"
    assert services["cassandra"]["image"].split(":")[1].startswith("5.")
    assert "9042:9042" in services["cassandra"]["ports"]
    assert ops_default("cassandra", "NATIVE_PORT") == "9042"
    assert "native_transport_port: $NATIVE_PORT" in (ROOT / "ops" / "cassandra").read_text()
    assert "2181:2181" in services["zookeeper"]["ports"]
    assert "then echo 2181;" in (ROOT / "ops" / "zookeeper").read_text()  # standalone port


def test_compose_commands_are_valid_scheduler_commands():
    import scheduler.cli.api  # registers its command
    import scheduler.cli.console
    import scheduler.cli.ops  # noqa: F401  (registers its commands)
    from scheduler.cli.common import app
    from scheduler.runtime.handlers import load_app
    from scheduler.settings import Settings

    root = cast(click.Group, get_command(app))
    known_env = set(re.findall(r"\b(SCHEDULER_[A-Z_]+)\b", (ROOT / "scheduler" / "settings.py").read_text()))
    checked = 0
    for name, svc in compose()["services"].items():
        cmd = svc.get("command")
        if not cmd or cmd[0] != "scheduler":
            continue
        args = list(cmd[1:])
        group: click.Command = root
        ctx = root.make_context("scheduler", list(args), resilient_parsing=False)
        while isinstance(group, click.Group):
            sub = group.get_command(ctx, args[0])
            assert sub is not None, f"{name}: no command {args[0]!r}"
            args = args[1:]
            ctx = sub.make_context(sub.name or "", list(args), parent=ctx)  # raises on a bad option
            group = sub
            if not isinstance(sub, click.Group):
                break
        if "--handler" in cmd:
            load_app(handler=cmd[cmd.index("--handler") + 1])
        assert set(svc.get("environment", {})) <= known_env
        Settings.from_env(svc.get("environment", {})).require_store()
        checked += 1
    assert checked == 8  # schema, four pollers (one with --processes 2), exporter, console, api


def test_compose_pollers_sign_http_requests_with_a_secret_made_once_in_a_volume(tmp_path):
    """Every poller names a signing secret file (else every http job is retried until
    dead), in a volume it mounts read-only, made before it starts by the one-shot service
    that owns the volume; that service's command makes a secret the pollers accept, once."""
    from scheduler.settings import http_signing_secret

    services = compose()["services"]
    maker = services["http-signing-secret"]
    [mount] = maker["volumes"]
    volume, folder = mount.split(":")
    assert volume in compose()["volumes"]
    pollers = [name for name in services if name.startswith("poller-")]
    assert len(pollers) == 4
    for name in pollers:
        svc = services[name]
        path = svc["environment"]["SCHEDULER_HTTP_SIGNING_SECRET_FILE"]
        assert f"{volume}:{folder}:ro" in svc["volumes"] and path.startswith(folder + "/"), name
        assert svc["depends_on"]["http-signing-secret"] == {"condition": "service_completed_successfully"}
        assert "schema" in svc["depends_on"] and svc["environment"]["SCHEDULER_STORE"], name
    script = maker["command"][2].replace(folder, str(tmp_path))
    assert maker["command"][:2] == ["sh", "-c"] and str(tmp_path) in script
    subprocess.run(["sh", "-c", script], check=True, timeout=30)
    made = tmp_path / path.rsplit("/", 1)[1]
    secret = http_signing_secret(str(made))
    assert len(secret) == 64 and (made.stat().st_mode & 0o077) == 0
    subprocess.run(["sh", "-c", script], check=True, timeout=30)
    assert http_signing_secret(str(made)) == secret, "a second start must keep the secret"
    comment = (ROOT / "docker-compose.yml").read_text().split("services:")[0]
    assert "cat /run/http/signing-secret" in comment


def test_the_image_has_the_extras_of_every_service_and_tracing():
    extras = re.search(r'pip install --no-cache-dir "\.\[([a-z,]+)\]"', (ROOT / "Dockerfile").read_text())
    assert extras and set(extras.group(1).split(",")) == {"console", "api", "tracing"}


def test_compose_prometheus_and_grafana_use_the_repo_files():
    doc = compose()
    services = doc["services"]
    prom_cfg = yaml.safe_load((PROM / "prometheus.yml").read_text())
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in prom_cfg["scrape_configs"]}
    exporter_port = services["exporter"]["command"][services["exporter"]["command"].index("--address") + 1]
    assert targets["scheduler-exporter"] == [f"exporter:{exporter_port.rsplit(':', 1)[1]}"]
    from scheduler.runtime.supervisor import offset_address

    expected = set()
    for name, svc in services.items():
        cmd = svc.get("command") or []
        if "--metrics-address" in cmd:
            base = cmd[cmd.index("--metrics-address") + 1]
            count = int(cmd[cmd.index("--processes") + 1]) if "--processes" in cmd else 1
            expected |= {f"{name}:{offset_address(base, i).rsplit(':', 1)[1]}" for i in range(count)}
    assert set(targets["scheduler-poller"]) == expected
    for svc in ("prometheus", "grafana"):
        for volume in services[svc]["volumes"]:
            src = volume.split(":")[0]
            assert (ROOT / src).exists(), f"{svc} mounts {src}, which does not exist"
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "scheduler.yml").read_text())
    dash_dir = provider["providers"][0]["options"]["path"]
    assert any(v.split(":")[1].startswith(dash_dir) for v in services["grafana"]["volumes"])
    assert services["prometheus"]["image"].endswith("v" + _promtool_version_or("2.42.0"))


def _promtool_version_or(default: str) -> str:
    """Compose runs the Prometheus release of the promtool the tests use, when known."""
    try:
        out = subprocess.run(["promtool", "--version"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return default
    m = re.search(r"version (\d+\.\d+\.\d+)", out)
    return m.group(1) if m else default


@pytest.mark.parametrize("path", ["Dockerfile", "docs/runbook.md"])
def test_files_compose_needs_exist(path: str):
    assert (ROOT / path).exists()


def test_every_package_is_in_the_wheel():
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "scheduler").rglob("__init__.py")}
    assert on_disk <= listed, f"pyproject.toml misses {sorted(on_disk - listed)}: a wheel would lack them"


def test_the_secure_compose_override_matches_the_secure_stack(tmp_path):
    """ops/secure-stack compose-files makes every file docker-compose.secure.yml mounts; its
    ports are the script's; the env files hold known settings; the Cassandra configuration
    has only keys that Cassandra's own cassandra.yaml knows."""
    import os

    res = subprocess.run([str(ROOT / "ops" / "secure-stack"), "compose-files"], capture_output=True,
                         text=True, env={**os.environ, "SCHEDULER_DATA_DIR": str(tmp_path)}, timeout=120)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "secure" / "compose"
    override = yaml.safe_load((ROOT / "docker-compose.secure.yml").read_text())
    script = (ROOT / "ops" / "secure-stack").read_text()
    base = compose()["services"]
    assert set(override["services"]) <= set(base)
    assert f"{ops_default_plain(script, 'CQL_PORT')}:9142" in override["services"]["cassandra"]["ports"][0]
    assert f"{ops_default_plain(script, 'ZK_PORT')}:2281" in override["services"]["zookeeper"]["ports"][0]
    known_env = set(re.findall(r"\b(SCHEDULER_[A-Z_]+)\b", (ROOT / "scheduler" / "settings.py").read_text()))
    for name, svc in override["services"].items():
        for vol in svc.get("volumes", []):
            host = vol.split(":")[0]
            assert (tmp_path / host.removeprefix("./.data/")).exists(), (name, vol)
        for env_file in svc.get("env_file", []):
            lines = (tmp_path / env_file.removeprefix(".data/")).read_text().splitlines()
            keys = {line.partition("=")[0] for line in lines}
            assert keys <= known_env, (name, keys - known_env)
            assert all("/secure/" in line for line in lines if "_FILE=" in line or "_CA=" in line)
    assert "COPY ops/secure_setup.py" in (ROOT / "Dockerfile").read_text()
    reference = next((Path.home() / ".cache" / "scheduler-ops").glob("cassandra-*/conf/cassandra.yaml"), None)
    if reference is not None:  # fetched by ops/cassandra (always in ops/test)
        known = set(re.findall(r"^#?\s?([a-z_]+):", reference.read_text(), flags=re.M))
        ours = set(yaml.safe_load((out / "cassandra" / "cassandra.yaml").read_text()))
        assert ours <= known, sorted(ours - known)
    assert "/conf/server.p12" in (out / "zookeeper" / "zoo.cfg").read_text()


def ops_default_plain(script: str, variable: str) -> str:
    m = re.search(rf"^{variable}=(\d+)$", script, flags=re.M)
    assert m, variable
    return m.group(1)


def test_every_query_file_names_each_statement_once():
    from scheduler.store.queries import parse_named

    for path in sorted((ROOT / "cql").rglob("*.*ql")):
        parse_named(path.read_text(encoding="utf-8"))  # raises on a name given twice
    with pytest.raises(ValueError, match="'a' is given twice"):
        parse_named("-- name: a\nSELECT 1;\n-- name: b\nSELECT 2;\n-- name: a\nSELECT 3;")


def test_compose_keeps_the_nudge_socket_off_the_host():
    """The nudge socket is unauthenticated UDP: pollers bind it inside their containers
    (the compose network, so producers there reach them), and no service publishes it."""
    text = (ROOT / "docker-compose.yml").read_text()
    doc = compose()
    notify = doc["x-scheduler"]["environment"]["SCHEDULER_NOTIFY_ADDRESS"]
    base_port = int(notify.rsplit(":", 1)[1])
    processes = max(int(s["command"][s["command"].index("--processes") + 1])
                    for s in doc["services"].values() if "--processes" in (s.get("command") or []))
    nudge_ports = {base_port + i for i in range(processes)}
    secure = yaml.safe_load((ROOT / "docker-compose.secure.yml").read_text())
    for name, svc in [*doc["services"].items(), *secure["services"].items()]:
        assert svc.get("network_mode") != "host", name
        for port in svc.get("ports", []):
            spec = str(port)
            assert not spec.endswith("/udp"), f"{name} publishes a UDP port: {spec}"
            container_port = int(spec.split("/")[0].rsplit(":", 1)[-1])
            if container_port in nudge_ports:  # the console's TCP port may share the number
                assert "console" in svc["command"], f"{name} publishes the nudge port {spec}"
    comment = text[:text.index("SCHEDULER_NOTIFY_ADDRESS")]
    assert "unauthenticated" in comment and "private network" in comment


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("layout", "lines"), [
    ([], ["node1 127.0.0.1:9999 "]),
    (["--nodes", "3"], ["node1 127.0.0.1:9999 ", "node2 127.0.0.2:9999 ", "node3 127.0.0.3:9999 "]),
    (["--nodes", "3", "--dcs", "2"],
     ["node1 127.0.0.1:9999 dc dc1 ", "node2 127.0.0.2:9999 dc dc1 ", "node3 127.0.0.3:9999 dc dc2 "]),
])
def test_ops_cassandra_status_runs_in_every_layout(tmp_path: Path, layout: list[str], lines: list[str]):
    """The script gets past its settings in every layout (a shell slip there once ended
    it before it printed anything): status of nodes that do not run, on an unused port,
    from a copy of the scripts (so its data folder is a fresh one, found as by default)."""
    ops = tmp_path / "ops"
    ops.mkdir()
    for name in ("cassandra", "lib.sh"):
        (ops / name).write_bytes((REPO / "ops" / name).read_bytes())
        (ops / name).chmod(0o755)
    res = subprocess.run([str(ops / "cassandra"), *layout, "status"], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                              "CASSANDRA_NATIVE_PORT": "9999"})
    assert res.returncode == 1, res.stderr  # every node down
    got = res.stdout.splitlines()
    assert [ln[:len(want)] for ln, want in zip(got, lines, strict=True)] == lines, res.stdout
    assert all(ln.endswith(" down") for ln in got)
