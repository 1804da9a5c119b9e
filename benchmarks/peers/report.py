"""The table printed after a run, and the chart drawn into docs/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: (key in a result's figures, column heading, format)
COLUMNS = [
    ("noop_per_s", "no-op jobs/s", "{:,.0f}"),
    ("write_per_s", "write+5ms jobs/s", "{:,.0f}"),
    ("enqueue_per_s", "enqueue/s", "{:,.0f}"),
    ("bulk_enqueue_per_s", "bulk enqueue/s", "{:,.0f}"),
    ("idle_p50_ms", "idle p50 ms", "{:.1f}"),
    ("idle_p90_ms", "idle p90 ms", "{:.1f}"),
    ("idle_p99_ms", "idle p99 ms", "{:.1f}"),
    ("backlog_p50_ms", "busy p50 ms", "{:.1f}"),
    ("backlog_p90_ms", "busy p90 ms", "{:.1f}"),
]


def table(results: list[dict[str, Any]]) -> str:
    """A Markdown table: one row per peer and layout."""
    head = ["peer", "procs", *(c[1] for c in COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for result in results:
        cells = [result["peer"], str(result["processes"])]
        for key, _, fmt in COLUMNS:
            value = result["figures"].get(key)
            cells.append("n/a" if value is None else fmt.format(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def chart(report: dict[str, Any], path: Path) -> bool:
    """Four panels: the two drain rates, and pickup latency idle and behind a backlog.
    False (and nothing drawn) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    results = [r for r in report["results"] if r["figures"]]
    layouts = sorted({r["processes"] for r in results})
    peers = list(dict.fromkeys(r["peer"] for r in results))
    panels = [
        ("noop_per_s", "No-op jobs per second (higher is better)", False),
        ("write_per_s", "Write + 5 ms jobs per second (higher is better)", False),
        ("idle_p50_ms", "Pickup latency, idle worker: p50 ms (lower is better)", True),
        ("backlog_p50_ms", "Pickup latency behind a backlog: p50 ms (lower is better)", True),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    width = 0.8 / max(1, len(layouts))
    for ax, (key, title, log) in zip(axes.flat, panels, strict=True):
        for i, processes in enumerate(layouts):
            values = []
            for peer in peers:
                found = [r for r in results if r["peer"] == peer and r["processes"] == processes]
                value = found[0]["figures"].get(key) if found else None
                values.append(value or 0.0)
            xs = [x + (i - (len(layouts) - 1) / 2) * width for x in range(len(peers))]
            bars = ax.bar(xs, values, width, label=f"{processes} process(es)")
            for bar, value in zip(bars, values, strict=True):
                label = "n/a" if not value else (f"{value:,.0f}" if value >= 10 else f"{value:.1f}")
                ax.annotate(label, (bar.get_x() + bar.get_width() / 2, max(value, 1e-3)),
                            ha="center", va="bottom", fontsize=7)  # fmt: skip
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(len(peers)))
        ax.set_xticklabels(peers, rotation=20, fontsize=8)
        if log:
            ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.suptitle(
        f"Job systems side by side on PostgreSQL ({report['machine'].split(',')[1].strip()}, "
        f"{report['date'][:10]})",
        fontsize=12,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return True
