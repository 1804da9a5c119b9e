"""The table printed after a run, the README's table, and the chart drawn into docs/.

``python -m benchmarks.peers.report [JSON]`` prints the full table of a run's JSON (by
default benchmarks/results/peers.json); with ``--readme``, the README's table (one worker
process each, one column per peer), ready to paste over the README's; ``--chart PATH``
draws the chart again from the JSON.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

#: (keys in a result's figures, shown "a / b" in one cell; column heading; format)
COLUMNS: list[tuple[tuple[str, ...], str, str]] = [
    (("noop_per_s",), "no-op jobs/s", "{:,.0f}"),
    (("write_per_s",), "write+5ms jobs/s", "{:,.0f}"),
    (("enqueue_per_s",), "enqueue/s", "{:,.0f}"),
    (("bulk_enqueue_per_s",), "bulk enqueue/s", "{:,.0f}"),
    (("start_fresh_p50_ms", "start_fresh_p95_ms"), "start probe, fresh p50 / p95 ms", "{:.1f}"),
    (("row_fresh_p50_ms", "row_fresh_p95_ms"), "row probe, fresh p50 / p95 ms", "{:.1f}"),
    (("start_drained_p50_ms", "start_drained_p95_ms"), "start probe, after drain p50 / p95 ms",
     "{:.1f}"),
    (("row_drained_p50_ms", "row_drained_p95_ms"), "row probe, after drain p50 / p95 ms",
     "{:.1f}"),
    (("backlog_p50_ms", "backlog_p95_ms"), "busy p50 / p95 ms", "{:.1f}"),
]  # fmt: skip

#: The README's rows: (heading, keys as in COLUMNS, format, unit).
README_ROWS: list[tuple[str, tuple[str, ...], str, str]] = [
    ("no-op jobs/s", ("noop_per_s",), "{:,.0f}", ""),
    ("write + 5 ms jobs/s", ("write_per_s",), "{:,.0f}", ""),
    ("enqueue/s (bulk)", ("enqueue_per_s",), "{:,.0f}", ""),
    ("pickup p50 / p95, job start, fresh worker", ("start_fresh_p50_ms", "start_fresh_p95_ms"),
     "{:.1f}", " ms"),
    ("pickup p50 / p95, row written, fresh worker", ("row_fresh_p50_ms", "row_fresh_p95_ms"),
     "{:.1f}", " ms"),
    ("pickup p50 / p95, row written, after a drain",
     ("row_drained_p50_ms", "row_drained_p95_ms"), "{:.1f}", " ms"),
    ("pickup behind a backlog p50", ("backlog_p50_ms",), "{:.1f}", " ms"),
]  # fmt: skip

#: The README's column headings, by peer.
README_NAMES = {
    "django-gator": "django-gator",
    "celery-threads": "Celery (threads)",
    "celery-prefork": "Celery (prefork)",
    "procrastinate": "procrastinate",
    "django-q2": "django-q2",
    "django-tasks-db": "django-tasks-db",
}


def cell(figures: dict[str, Any], keys: tuple[str, ...], fmt: str, unit: str = "") -> str:
    """The figures of ``keys`` in one cell, "a / b"; "n/a" if none was measured. With the
    unit " ms", a cell whose figures reach a second is given in seconds."""
    values = [figures.get(key) for key in keys]
    if all(value is None for value in values):
        return "n/a"
    if unit == " ms" and min(v for v in values if v is not None) >= 1000:
        values = [None if v is None else v / 1000 for v in values]
        unit = " s"
    return " / ".join("n/a" if v is None else fmt.format(v) for v in values) + unit


def table(results: list[dict[str, Any]]) -> str:
    """A Markdown table: one row per peer and layout."""
    head = ["peer", "procs", *(c[1] for c in COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for result in results:
        cells = [result["peer"], str(result["processes"])]
        cells += [cell(result["figures"], keys, fmt) for keys, _, fmt in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def readme_table(results: list[dict[str, Any]], processes: int = 1) -> str:
    """The README's table: one column per peer (the layout of ``processes`` worker
    processes), one row per figure; the bulk enqueue in brackets after the single one."""
    chosen = [r for r in results if r["processes"] == processes and r["figures"]]
    head = ["", *(README_NAMES.get(r["peer"], r["peer"]) for r in chosen)]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * len(chosen)]
    for heading, keys, fmt, unit in README_ROWS:
        cells = []
        for result in chosen:
            text = cell(result["figures"], keys, fmt, unit)
            bulk = result["figures"].get("bulk_enqueue_per_s")
            if keys == ("enqueue_per_s",) and bulk is not None:
                text += f" ({bulk:,.0f})"
            cells.append(text)
        lines.append("| " + " | ".join([heading, *cells]) + " |")
    return "\n".join(lines)


def _figure(results: list[dict[str, Any]], peer: str, processes: int, key: str) -> float | None:
    found = [r for r in results if r["peer"] == peer and r["processes"] == processes]
    return found[0]["figures"].get(key) if found else None


def chart(report: dict[str, Any], path: Path) -> bool:
    """Six panels: the two drain rates, the two probes' p50 right after the workers start,
    the row-writing probe's after a drain, and pickup behind a backlog (each latency's p95
    a black tick). False (and nothing drawn) without matplotlib."""
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
        ("start_fresh_p50_ms", "Pickup, job start, fresh worker: p50 (bar), p95 ms", True),
        ("row_fresh_p50_ms", "Pickup, row written, fresh worker: p50 (bar), p95 ms", True),
        ("row_drained_p50_ms", "Pickup, row written, after a drain: p50 (bar), p95 ms", True),
        ("backlog_p50_ms", "Pickup behind a backlog: p50 (bar), p95 ms", True),
    ]
    fig, axes = plt.subplots(3, 2, figsize=(13, 11))
    width = 0.8 / max(1, len(layouts))
    for ax, (key, title, log) in zip(axes.flat, panels, strict=True):
        for i, processes in enumerate(layouts):
            values = [_figure(results, peer, processes, key) or 0.0 for peer in peers]
            xs = [x + (i - (len(layouts) - 1) / 2) * width for x in range(len(peers))]
            bars = ax.bar(xs, values, width, label=f"{processes} process(es)")
            if key.endswith("_p50_ms"):  # the p95 as a black tick over each bar
                p95 = [_figure(results, peer, processes, key.replace("_p50_", "_p95_"))
                       for peer in peers]  # fmt: skip
                ax.scatter(xs, [v or float("nan") for v in p95], marker="_", color="black",
                           s=120, zorder=3, label="p95" if i == 0 else None)  # fmt: skip
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


def main(argv: list[str] | None = None) -> int:
    import json

    root = Path(__file__).resolve().parents[2]
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers.report", description=__doc__)
    parser.add_argument(
        "json", nargs="?", type=Path, default=root / "benchmarks/results/peers.json"
    )
    parser.add_argument("--readme", action="store_true", help="the README's table")
    parser.add_argument("--processes", type=int, default=1, help="the README's layout")
    parser.add_argument("--chart", type=Path, help="also draw the chart into this file")
    args = parser.parse_args(argv)
    report = json.loads(args.json.read_text())
    if args.chart is not None and not chart(report, args.chart):
        parser.error("drawing the chart needs matplotlib (in .venv-peers)")
    if args.readme:
        print(readme_table(report["results"], args.processes))
    else:
        print(table(report["results"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
