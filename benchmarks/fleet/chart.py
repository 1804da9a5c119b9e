"""The fleet's chart: throughput and claim p99 against worker processes, directly and
through PgBouncer (needs matplotlib, the ``bench`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

STYLE = {"direct": ("tab:blue", "o"), "pgbouncer": ("tab:orange", "s")}
#: Series of other names (the control, a rerun), in the order they come.
OTHERS = [("tab:green", "^"), ("tab:gray", "x"), ("tab:purple", "D")]


def draw(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = report["run"]
    options = run["options"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    others = iter(OTHERS)
    for series in report["fleet"]:
        style = STYLE.get(series["mode"]) or next(others, ("tab:gray", "x"))
        color, marker = style
        x = [step["processes"] for step in series["steps"]]
        left.plot(
            x,
            [s["throughput"] for s in series["steps"]],
            marker=marker,
            color=color,
            label=series["mode"],
        )
        right.plot(
            x,
            [s["claim"]["p99_ms"] for s in series["steps"]],
            marker=marker,
            color=color,
            label=f"{series['mode']} p99",
        )
        right.plot(
            x,
            [s["claim"]["p50_ms"] for s in series["steps"]],
            marker=marker,
            color=color,
            linestyle=":",
            label=f"{series['mode']} p50",
        )
    counts = sorted({s["processes"] for series in report["fleet"] for s in series["steps"]})
    cpus = run.get("cpus") or 0
    for ax in (left, right):
        if cpus:
            ax.axvline(cpus, color="gray", linewidth=0.8, linestyle="--")
            ax.annotate(
                f"{cpus} CPUs",
                (cpus, 0),
                xytext=(3, 3),
                textcoords="offset points",
                xycoords=("data", "axes fraction"),
                fontsize=8,
                color="gray",
            )
        ax.set_xlabel(
            f"worker processes ({options['hosts']} network hosts, "
            f"{options['concurrency']} threads each)"
        )
        ax.set_xticks(counts)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    left.set_ylabel("jobs/s")
    left.set_ylim(bottom=0)
    left.set_title("Throughput (backlog kept full)")
    right.set_ylabel("ms")
    right.set_yscale("log")
    right.set_title("Claim latency, worker-side")
    load = run.get("load_average") or [0]
    fig.suptitle(
        f"django-gator fleet: {options['job']} jobs, {options['step']:g} s per step; "
        f"{run['date'][:16]} UTC, commit {run.get('commit')}, load at start {load[0]:.1f}"
        + (f"\n{run['note']}" if run.get("note") else ""),
        fontsize=11,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
