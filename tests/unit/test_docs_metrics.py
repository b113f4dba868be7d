"""docs/operations.md agrees with the code: its metrics table lists exactly the series the
pollers, the exporter and the API can serve (names as exposed, counters with ``_total``, and their
labels), and its Prometheus scrape configuration is one Prometheus accepts, with the job
name the alert rules select on. Every other page and the README name only metrics the code
registers, as exposed: a name copied without its ``_total`` is a query that finds
nothing."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from scheduler.domain.clock import FakeClock
from scheduler.observe.audit import AuditReport, PartCount
from scheduler.observe.exporter import LagExporter
from scheduler.observe.lag import ShardLag
from scheduler.observe.metrics import ApiMetrics, PollerMetrics

ROOT = Path(__file__).parents[2]
DOC = ROOT / "docs" / "operations.md"
PROM = ROOT / "ops" / "prometheus"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Anything shaped like one of our metric names; a trailing * makes it a family prefix
# (`scheduler_audit_*`). Lowercase only: SCHEDULER_* settings are not metrics.
METRIC_TOKEN = re.compile(r"\bscheduler_[a-z_]+\*?")
# Tokens of that shape in the docs that are not metric names, each with the reason. Empty
# today; add one here rather than weakening the scan.
NOT_METRICS: dict[str, str] = {}
# The series Prometheus derives from a histogram family.
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
ROW = re.compile(r"^\| `([a-z_]+)` \| (counter|gauge|histogram|info) \| ([^|]*) \| ([^|]*) \|")


def documented() -> dict[str, tuple[str, frozenset[str]]]:
    """The metrics table of docs/operations.md: name -> (type, labels)."""
    section = DOC.read_text().split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, frozenset[str]]] = {}
    for line in section.splitlines():
        m = ROW.match(line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} is listed twice"
            labels = frozenset(re.findall(r"`([a-z_]+)`", m.group(3)))
            rows[m.group(1)] = (m.group(2), labels)
    return rows


def registered() -> dict[str, tuple[str, frozenset[str]]]:
    """Every family a poller's, the exporter's and the API's registries can serve, with
    every optional part switched on: each labelled series written once, an exporter after a
    refresh with ZooKeeper, a recurring check and an audit (--audit-interval)."""
    poller, api = PollerMetrics(), ApiMetrics()
    for metric in [*vars(poller).values(), *vars(api).values()]:
        names = getattr(metric, "_labelnames", ())
        if names:
            metric.labels(*["x"] * len(names))
    exporter = LagExporter(cast(Any, None), FakeClock(), audit_interval_s=600)
    exporter._rows = [ShardLag(0, "p", 0, 0.0, 0, False, None)]
    exporter._members = 3
    exporter._recurring = {"active": 1, "paused": 0, "broken": 0}
    exporter._audit = (AuditReport(0, 0, [PartCount(0, 0)]), 0.0, 0.0)
    found: dict[str, tuple[str, frozenset[str]]] = {}
    for registry in (poller.registry, exporter.registry, api.registry):
        for family in registry.collect():
            name = family.name + "_total" if family.type == "counter" else family.name
            labels = frozenset(k for s in family.samples for k in s.labels if k not in {"le"})
            found[name] = (family.type, labels)
    return found


def test_the_metrics_table_lists_every_registered_metric_with_its_type_and_labels():
    docs, code = documented(), registered()
    assert sorted(set(code) - set(docs)) == [], "registered but not in docs/operations.md"
    assert sorted(set(docs) - set(code)) == [], "in docs/operations.md but registered nowhere"
    for name, (kind, labels) in code.items():
        assert docs[name] == (kind, labels), f"{name}: docs say {docs[name]}, code {kind} {set(labels)}"


def test_the_table_parser_sees_rows():
    # Guards the test above against a table it cannot read (it would compare nothing).
    assert len(documented()) >= 40
    assert documented()["scheduler_handler_timeouts_total"] == ("counter", frozenset({"kind"}))


def scrape_config() -> dict[str, Any]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    configs = [yaml.safe_load(b) for b in blocks if "scrape_configs" in b]
    assert len(configs) == 1, "docs/operations.md should hold one Prometheus configuration"
    return cast(dict[str, Any], configs[0])


def test_the_scrape_job_is_the_one_the_alert_rules_select_on():
    jobs = [c["job_name"] for c in scrape_config()["scrape_configs"]]
    rules = (PROM / "alerts.yml").read_text()
    selected = set(re.findall(r'job="([^"]+)"', rules))
    assert selected == {"scheduler-exporter"}
    assert selected <= set(jobs)


def test_promtool_accepts_the_documented_configuration(tmp_path: Path, promtool: str):
    config = scrape_config()
    for rule_file in config.get("rule_files", []):
        shutil.copy(PROM / Path(rule_file).name, tmp_path / rule_file)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    res = subprocess.run([promtool, "check", "config", "prometheus.yml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def unknown_metric_names(text: str, code: dict[str, tuple[str, frozenset[str]]]) -> list[str]:
    """Every metric-shaped token of ``text`` that names nothing ``code`` registers: not a
    name as exposed, not a histogram's ``_bucket``/``_count``/``_sum`` series, and (for a
    ``prefix_*`` token) not the prefix of any registered name."""
    bad = []
    for token in METRIC_TOKEN.findall(text):
        if token in NOT_METRICS or token in code:
            continue
        if token.endswith("*"):
            if any(name.startswith(token[:-1]) for name in code):
                continue
        elif any(token == base + suffix and code[base][0] == "histogram"
                 for base in code for suffix in HISTOGRAM_SUFFIXES):
            continue
        bad.append(token)
    return sorted(set(bad))


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_every_page_names_only_registered_metrics(path: Path):
    assert unknown_metric_names(path.read_text(encoding="utf-8"), registered()) == []


def test_the_page_scan_finds_a_name_the_code_does_not_serve():
    code = registered()
    text = ("`scheduler_handler_timeouts{kind}` `scheduler_handler_timeouts_total{kind}` "
            "`scheduler_fire_lateness_seconds_bucket` `scheduler_poll_duration_seconds_count` "
            "`scheduler_jobs_fired_total_sum` `scheduler_audit_*` `scheduler_nothing_*` "
            "SCHEDULER_METRICS_ADDRESS")
    assert unknown_metric_names(text, code) == [
        "scheduler_handler_timeouts", "scheduler_jobs_fired_total_sum", "scheduler_nothing_*"]
    assert len(PAGES) > 10
