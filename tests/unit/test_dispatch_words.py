"""Two words kept apart (``scheduler/poller/poller.py``): a shard is *released* (handed
to another owner); a job is *dispatched* (handed to a handler). Names, the CLI's help
and the metrics' help say which. The metric ``scheduler_release_throttled`` keeps its
name (dashboards and alerts query it); only its help says what it counts."""

from __future__ import annotations

import typer
from typer.main import get_command

import scheduler.cli.main  # noqa: F401  (registers every command)
from scheduler.cli.common import app
from scheduler.observe.metrics import PollerMetrics
from scheduler.poller import Poller


def test_the_poller_dispatches_jobs_and_releases_only_shards():
    assert callable(getattr(Poller, "dispatch_ready", None))
    releasing = sorted(n for n in vars(Poller) if "releas" in n.lower())
    assert releasing == ["_finish_release", "release"]
    for name in releasing:
        assert "shard" in (getattr(Poller, name).__doc__ or ""), name


def test_run_help_says_jobs_are_dispatched_and_shards_released():
    group = get_command(app)
    run = group.get_command(typer.Context(group), "run")  # type: ignore[attr-defined]
    helps = {p.name: getattr(p, "help", "") or "" for p in run.params}
    assert "dispatch" in helps["max_rate"] and "dispatch" in helps["max_shard_rate"]
    for name, text in helps.items():
        if "releas" in text.lower():
            assert "shard" in text, f"--{name}: {text}"


def test_the_throttle_metric_keeps_its_name_and_says_dispatch():
    docs = {m.name: m.documentation for m in PollerMetrics().registry.collect()}
    assert "dispatch-rate" in docs["scheduler_release_throttled"]
    for name, doc in docs.items():
        assert "releas" not in doc.lower() or "shard" in doc.lower(), f"{name}: {doc}"
