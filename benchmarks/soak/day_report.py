"""Day runs side by side: ``python -m benchmarks.soak.day_report A.json [B.json ...]``
prints each run's per-minute figures in adjacent columns and their checks, and with
``--chart PATH`` draws one chart with every run's lines (``draw`` draws a single run's,
which the harness does at the end of a run)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: (column, unit, value of a minute record) of the table and the chart's panels.
SERIES: list[tuple[str, str, Any]] = [
    ("jobs/s done", "jobs/s", lambda m: m.get("jobs_per_s")),
    ("offered/s", "jobs/s", lambda m: round((m["dispatched"] + m.get("web_dispatched", 0)) / 60)),
    ("dispatch p50", "ms", lambda m: (m.get("dispatch") or {}).get("p50")),
    ("dispatch p99", "ms", lambda m: (m.get("dispatch") or {}).get("p99")),
    ("claim p50", "ms", lambda m: m["claim"]["p50"]),
    ("claim p99", "ms", lambda m: m["claim"]["p99"]),
    ("size MiB", "MiB", lambda m: (m.get("storage") or {}).get("total_mb")),
    ("hot MiB", "MiB", lambda m: (m.get("storage") or {}).get("hot_mb")),
    ("claimed MiB", "MiB", lambda m: (m.get("storage") or {}).get("claimed_mb")),
    ("dead tup", "tuples", lambda m: (m.get("storage") or {}).get("n_dead_tup")),
    ("autovac", "runs", lambda m: (m.get("storage") or {}).get("autovacuum_runs")),
    ("db us/job", "us", lambda m: m.get("cluster_cpu_us_per_job")),
    ("worker db us/job", "us", lambda m: m.get("worker_db_cpu_us_per_job")),
    ("RSS MiB", "MiB", lambda m: max((w["rss_mb"] for w in m["workers"]), default=None)),
]
#: Panels of the chart: (title, unit, columns of SERIES, log scale).
PANELS = [
    (
        "Jobs done (finished) and offered (dispatched) per second",
        "jobs/s",
        ["jobs/s done", "offered/s"],
        False,
    ),
    ("Dispatch latency (web processes)", "ms", ["dispatch p50", "dispatch p99"], True),
    ("Claim latency (worker-side)", "ms", ["claim p50", "claim p99"], True),
    (
        "Jobs table + indexes (all partitions; hot part; the part claims read)",
        "MiB",
        ["size MiB", "hot MiB", "claimed MiB"],
        False,
    ),
    ("Dead tuples (all partitions)", "tuples", ["dead tup"], False),
    ("Autovacuum runs so far (all partitions)", "runs", ["autovac"], False),
    (
        "Database CPU per finished job (cluster; workers' backends)",
        "us",
        ["db us/job", "worker db us/job"],
        False,
    ),
    ("Worker RSS (largest)", "MiB", ["RSS MiB"], False),
]


def label(document: dict[str, Any]) -> str:
    meta = document["meta"]
    storage = meta.get("partitioning") or "none"
    name = "DELETE pruning" if storage == "none" else f"partitioned by {storage}"
    notify = ", GATOR_NOTIFY off" if meta.get("notify") == "off" else ""
    return f"{name}{notify}, {meta['rate']:g}/s"


def table(documents: list[dict[str, Any]]) -> str:
    columns = [name for name, _, _ in SERIES]
    head = "min | " + " || ".join(" | ".join(columns) for _ in documents)
    lines = [" || ".join(label(d) for d in documents), head]
    runs = [[m for m in d["minutes"] if not m.get("partial")] for d in documents]
    for i in range(max(len(r) for r in runs)):
        cells = []
        for minutes in runs:
            m = minutes[i] if i < len(minutes) else None
            cells.append(" | ".join(_cell(get(m)) if m else "-" for _, _, get in SERIES))
        lines.append(f"{i + 1:>3} | " + " || ".join(cells))
    for d in documents:
        summary = d.get("summary") or {}
        lines.append(f"\n{label(d)}: checks")
        for check in summary.get("checks", []):
            lines.append(f"  [{'PASS' if check['ok'] else 'FAIL'}] {check['name']}")
        drops = (summary.get("day") or {}).get("partition_drops") or []
        lines.append(f"  partition drops: {len(drops)} {[x['partition'] for x in drops]}")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if value < 100 else f"{value:.0f}"
    return str(value)


def draw(documents: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    getters = {name: get for name, _, get in SERIES}
    fig, axes = plt.subplots(4, 2, figsize=(14, 15), sharex=True)
    meta = documents[0]["meta"]
    fig.suptitle(
        "django-gator, a day's load in an hour: "
        + " vs ".join(label(d) for d in documents)
        + f"\n{meta['machine']['cpus']} CPUs, {meta['cluster']} PostgreSQL cluster, "
        f"{meta['date'][:16]}, "
        f"commit {meta['git_commit']}",
        fontsize=12,
    )
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for ax, (title, unit, columns, log) in zip(axes.flat, PANELS, strict=True):
        for d, color in zip(documents, colors, strict=False):
            minutes = [m for m in d["minutes"] if not m.get("partial")]
            x = [m["minute"] for m in minutes]
            for column, style in zip(columns, ("-", "--", ":"), strict=False):
                y = [getters[column](m) for m in minutes]
                ax.plot(x, y, style, color=color, label=f"{column}, {label(d)}")
        ax.set_title(title, fontsize=11)
        ax.set_ylabel(unit)
        if log:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("minute")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak.day_report", description=__doc__)
    p.add_argument("reports", type=Path, nargs="+", help="JSON reports of day runs")
    p.add_argument("--chart", type=Path, help="draw the runs side by side into this PNG")
    args = p.parse_args(argv)
    documents = [json.loads(path.read_text()) for path in args.reports]
    print(table(documents))
    if args.chart:
        draw(documents, args.chart)
        print(f"chart: {args.chart}")
    checks = [c for d in documents for c in (d.get("summary") or {}).get("checks", [])]
    failed = [c for c in checks if not c["ok"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
