"""The benchmark report's rendering: report.md from report.json's data, and the PNG
plots (matplotlib, the ``bench`` extra). No benchmark runs here."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plots(out: Path, series: dict[str, Any]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    fig, ax = plt.subplots(figsize=(7, 4))
    if series["lateness"]:
        ax.hist(series["lateness"], bins=60, color="#3b7dd8")
        ax.set_yscale("log")
    ax.set_xlabel("lateness, ms (handler start - due time)")
    ax.set_ylabel("jobs")
    ax.set_title("Lateness at 1,000 jobs/s, 1 s poll interval")
    fig.tight_layout()
    fig.savefig(out / "lateness.png", dpi=110)
    plt.close(fig)
    made.append("lateness.png")

    if series.get("peer"):
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, label in (("ours", "this scheduler (Cassandra)"), ("postgres", "Postgres SKIP LOCKED")):
            values = sorted(series["peer"].get(name, []))
            if values:
                ax.plot(values, [i / len(values) for i in range(len(values))], label=label)
        ax.set_xscale("symlog")
        ax.set_xlabel("lateness, ms")
        ax.set_ylabel("fraction of jobs")
        ax.set_title("Peer workload: lateness distribution (CDF)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "peer_lateness.png", dpi=110)
        plt.close(fig)
        made.append("peer_lateness.png")

    if series.get("fleet"):
        fig, ax = plt.subplots(figsize=(6, 4))
        ns = sorted(series["fleet"])
        ax.plot(ns, [series["fleet"][n] for n in ns], marker="o", label="measured")
        ax.plot(ns, [series["fleet"][1] * n for n in ns], linestyle="--", label="linear")
        ax.set_xticks(ns)
        ax.set_xlabel("pollers")
        ax.set_ylabel("jobs/s (10 ms handler)")
        ax.set_title("Fleet throughput against pollers")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "fleet_scaling.png", dpi=110)
        plt.close(fig)
        made.append("fleet_scaling.png")
    return made


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 100 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# Benchmark report ({'quick' if report['quick'] else 'full'} mode)", "",
             f"- date: {report['date']}", f"- command: `{report['command']}`",
             f"- machine: {report['machine']['cpus']} cores ({report['machine']['cpu_model']}), "
             f"{report['machine']['memory_gib']} GiB, {report['machine']['platform']}",
             f"- Cassandra driver: {_driver_line(report['machine'].get('cassandra_driver'))}",
             f"- garbage collector thresholds: {report['machine'].get('gc_thresholds', 'not recorded')} "
             "(this process, baselines included; a poller's: see docs/handlers.md)",
             "- versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
             "- sizes: " + ", ".join(f"{k} {fmt(v)}" for k, v in report["sizes"].items()),
             f"- total time: {report['seconds']:.0f} s", "",
             "| key | value | baseline | ratio | goal | met |", "|---|---|---|---|---|---|"]
    for key, e in report["results"].items():
        met = {True: "yes", False: "**no**", None: "reported"}[e["met"]]
        lines.append(f"| `{key}` | {fmt(e['value'])} {e['unit']} | {fmt(e['baseline'])} ({e['baseline_is']}) "
                     f"| {fmt(e['ratio'])}{_spread_text(e['details'])} | {e['goal']} | {met} |")
    fire = report["results"].get("fire_throughput")
    if fire and "per_round" in fire["details"]:
        d = fire["details"]
        lines += ["", f"`fire_throughput`: value and baseline are medians over {d['rounds']} paired rounds; "
                      "the ratio is the median of the rounds' ratios ("
                  + ", ".join(fmt(r["ratio"]) for r in d["per_round"]) + "). Against a bare loop that "
                  f"also skips the driver's per-row binding, as the poller does: "
                  f"{fmt(d.get('ratio_vs_fast_bind_loop'))}. A loop doing only the reads: "
                  f"{fmt(d.get('read_only_jobs_per_s'))} jobs/s (poller / read-only "
                  f"{fmt(d.get('ratio_poller_vs_read_only'))}, read-and-record / read-only "
                  f"{fmt(d.get('ratio_bare_vs_read_only'))})."]
        cpu = d.get("cpu_us_per_job")
        if cpu:
            parts = [f"{side.replace('_', '-')} {fmt(c['client'])} + {fmt(c['cassandra'])}"
                     for side, c in cpu.items()]
            lines.append("CPU per job, µs (this process + Cassandra): " + "; ".join(parts) + ".")
    lines += _flow_notes(report["results"])
    peer = report["results"].get("peer_postgres")
    if peer:
        d = peer["details"]
        lines += ["", f"## Peer: {d['near_jobs']:,} jobs due over {d['window_s']:g} s "
                      f"({d['offered_jobs_per_s']:,} jobs/s offered), then {d['near_jobs']:,} due at once; "
                      f"{d['far_jobs']:,} far jobs stored",
                  "", "| system | fired | jobs/s | lateness p50 | p99 | max | empty poll |",
                  "|---|---|---|---|---|---|---|"]
        for side in ("scheduler", "postgres", "scheduler_drain", "postgres_drain"):
            s = d[side]
            when = "all due at once" if side.endswith("drain") else f"over {d['window_s']:g} s"
            lines.append(f"| {s['system']}, {when} | {s['fired']:,}/{s['expected']:,} "
                         f"| {s['fire_jobs_per_s']:,} "
                         f"| {fmt(s['lateness_p50_ms'])} ms | {fmt(s['lateness_p99_ms'])} ms "
                         f"| {fmt(s['lateness_max_ms'])} ms | {fmt(s['empty_poll_ms'])} ms |")
        procs = d.get("processes")
        for i, pr in enumerate(procs["per_round"] if procs else []):
            for s in (pr["scheduler"], pr["postgres"]):
                lines.append(f"| {s['system']}, all due at once, round {i + 1} "
                             f"| {s['fired']:,}/{s['expected']:,} "
                             f"| {s['fire_jobs_per_s']:,} | {fmt(s['lateness_p50_ms'])} ms "
                             f"| {fmt(s['lateness_p99_ms'])} ms | {fmt(s['lateness_max_ms'])} ms | - |")
        if procs:
            lines += ["", f"`peer_postgres` is `scheduler run --processes {procs['processes']}` "
                          f"over the peer's drain, the median of {procs['rounds']} paired rounds: "
                          f"{fmt(procs['ratio'])}"
                          f"{_spread_text(procs)}; one in-process poller's drain over the peer's first: "
                          f"{fmt(d.get('one_process_ratio'))}."]
    lines += ["", "Plots: " + ", ".join(f"[{p}]({p})" for p in report["plots"]), "",
              "Details of every figure are in report.json."]
    return "\n".join(lines) + "\n"


def spread(details: dict[str, Any]) -> tuple[float, float, int] | None:
    """The lowest and highest of a figure's per-round ratios, and how many rounds: what a
    median of paired rounds hides (None for a figure of one run)."""
    rounds = details.get("per_round") or (details.get("processes") or {}).get("per_round")
    if isinstance(rounds, list) and rounds and isinstance(rounds[0], dict):
        name = "ratio" if "ratio" in rounds[0] else "cpu_ratio" if "cpu_ratio" in rounds[0] else None
        if name is not None:
            values = [float(r[name]) for r in rounds]
            return min(values), max(values), len(values)
    return None


def _spread_text(details: dict[str, Any]) -> str:
    s = spread(details)
    return "" if s is None else f" (rounds {fmt(s[0])} to {fmt(s[1])}, {s[2]})"


def _driver_line(d: dict[str, Any] | None) -> str:
    if not d:
        return "not recorded"
    return (f"{d['version']}, compiled modules {d['compiled_modules']}, "
            f"Cython row parser {'on' if d['cython_row_parser'] else '**off**'}")


def _flow_notes(results: dict[str, Any]) -> list[str]:
    """The flow-control figures a table row has no room for."""
    lines = []
    rate = results.get("rate_limit_accuracy")
    if rate and "max_in_1s" in rate["details"]:
        d = rate["details"]
        lines += ["", f"`rate_limit_accuracy`: at most {d['max_in_1s']} starts in any 1 s (limit + burst: "
                      f"{fmt(d['limit_plus_burst'])}); starts in each second: "
                  + ", ".join(str(n) for n in d["per_second"]) + "."]
    over = results.get("flow_control_overhead")
    if over and "per_round" in over["details"]:
        d = over["details"]
        lines += ["", "`flow_control_overhead`: the median of the rounds' ratios of jobs per CPU-second ("
                  + ", ".join(fmt(r["cpu_ratio"]) for r in d["per_round"]) + "); of wall-clock jobs/s, "
                  + f"{fmt(d['wall_clock_ratio'])} (rounds "
                  + ", ".join(fmt(r["wall_ratio"]) for r in d["per_round"]) + ")."]
    off = results.get("tracing_off_overhead")
    if off and "ratio_quartiles" in off["details"]:
        d = off["details"]
        lines += ["", f"`tracing_off_overhead`: the median of {d['pairs']} paired ratios ({d['measured']}); "
                      f"quartiles {fmt(d['ratio_quartiles'][0])} and {fmt(d['ratio_quartiles'][1])}."]
    return lines
