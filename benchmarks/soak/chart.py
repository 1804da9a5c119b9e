"""The soak's chart: one PNG with a panel per quantity, per minute (needs matplotlib, the
``bench`` extra)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any


def draw(document: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta = document["meta"]
    minutes = [m for m in document["minutes"] if not m.get("partial")]
    x = [m["minute"] for m in minutes]
    extra = any(m.get("features") for m in minutes)  # this round's features (2026-11-24)
    rows = 5 if extra else 4
    fig, axes = plt.subplots(rows, 2, figsize=(14, 3.75 * rows), sharex=True)
    server = meta["server"]["version"].split(" on ")[0]
    autovacuum = meta["server"]["settings"].get("autovacuum", "?")
    title = (
        f"django-gator soak: {meta['rate']:g} jobs/s to {meta['workers']} worker(s) x "
        f"{meta['concurrency']} threads, {len(minutes)} min"
        + (", one long read transaction open" if meta.get("long_transaction") else "")
        + f"\n{server}, {meta['cluster']} cluster (autovacuum {autovacuum}), "
        f"{meta['machine']['cpus']} CPUs shared, {meta['date'][:10]}, commit {meta['git_commit']}"
    )
    fig.suptitle(title, fontsize=13)

    def series(key: str, field: str) -> list[float | None]:
        return [m[key][field] for m in minutes]

    ax = axes[0][0]
    ax.plot(x, series("claim", "p50"), label="p50", color="tab:blue")
    ax.plot(x, series("claim", "p99"), label="p99", color="tab:blue", linestyle="--")
    _finish(ax, "Claim latency (all claims, worker-side)", "ms", log=True)

    ax = axes[0][1]
    ax.plot(x, series("mark", "p50"), label="p50", color="tab:green")
    ax.plot(x, series("mark", "p99"), label="p99", color="tab:green", linestyle="--")
    _finish(ax, "Success-mark latency (batched, worker-side)", "ms", log=True)

    ax = axes[1][0]
    for name, color, label in (
        ("claim", "tab:blue", "full claim, 1 job"),
        ("mark", "tab:green", "success mark, 8 jobs"),
        ("queues", "tab:olive", "queues with ready jobs"),
    ):
        values = [(m["probe"].get(name) or {}).get("buffers") for m in minutes]
        ax.plot(x, values, label=label, color=color, marker=".")
    _finish(ax, "EXPLAIN probe: buffers per statement (median per minute)", "buffers", log=True)

    ax = axes[1][1]
    ax.plot(x, [m["dispatched"] / 60 for m in minutes], label="dispatched", color="tab:gray")
    finished = [sum(m["finished"].get(s, 0) for s in ("succeeded", "dead")) / 60 for m in minutes]
    ax.plot(x, finished, label="finished (succeeded + dead)", color="tab:purple")
    _finish(ax, "Throughput, and the server's oldest other transaction", "jobs/s", bottom=0)
    twin = ax.twinx()
    held = [(m.get("horizon") or {}).get("oldest_xact_s", 0.0) / 60 for m in minutes]
    twin.plot(
        x,
        held,
        color="tab:red",
        linestyle=":",
        label="oldest other open transaction (holds back cleanup)",
    )
    twin.set_ylabel("minutes")
    twin.set_ylim(0, max(max(held, default=0.0), 1.0) * 1.35)
    _merge_legends(ax, twin)

    ax = axes[2][0]
    ax.plot(x, series("backlog", "due_max"), label="jobs due and waiting (max)", color="tab:red")
    _finish(ax, "Drain lag", "jobs", bottom=0)
    twin = ax.twinx()
    twin.plot(
        x,
        series("backlog", "oldest_s_max"),
        color="tab:orange",
        linestyle="--",
        label="oldest due job's age (max)",
    )
    twin.set_ylabel("seconds")
    twin.set_ylim(0, max(filter(None, series("backlog", "oldest_s_max")), default=1.0) * 1.35)
    _merge_legends(ax, twin)

    ax = axes[2][1]
    ax.plot(x, [m["table"]["rows"] / 1000 for m in minutes], label="rows", color="tab:brown")
    postgresql = "history_list_length" not in (minutes[0]["table"] if minutes else {})
    ax.plot(
        x,
        [
            (m["table"].get("n_dead_tup" if postgresql else "history_list_length") or 0) / 1000
            for m in minutes
        ],
        label="dead tuples (n_dead_tup)" if postgresql else "InnoDB history list (purge backlog)",
        color="black",
    )
    vacuums = [
        m["minute"]
        for prev, m in itertools.pairwise(minutes)
        if (m["table"].get("autovacuum_count") or 0) > (prev["table"].get("autovacuum_count") or 0)
    ]
    for i, minute in enumerate(vacuums):
        ax.axvline(
            minute,
            color="tab:cyan",
            alpha=0.5,
            linewidth=1,
            label="minute with an autovacuum" if i == 0 else None,
        )
    _finish(ax, "Jobs table", "thousands", bottom=0)

    ax = axes[3][0]
    twin = ax.twinx()
    for i in range(max((len(m["workers"]) for m in minutes), default=0)):
        ax.plot(
            x,
            [m["workers"][i]["rss_mb"] if len(m["workers"]) > i else None for m in minutes],
            label=f"worker {i + 1} RSS",
        )
        twin.plot(
            x,
            [m["workers"][i]["threads"] if len(m["workers"]) > i else None for m in minutes],
            linestyle=":",
            label=f"worker {i + 1} threads",
        )
    _finish(ax, "Worker memory and threads", "RSS, MiB", bottom=0)
    twin.set_ylabel("threads")
    threads = [w["threads_max"] for m in minutes for w in m["workers"]]
    twin.set_ylim(0, max(threads, default=1) * 1.35)
    _merge_legends(ax, twin)

    ax = axes[3][1]
    ax.plot(
        x,
        [m["worker_db_cpu_us_per_job"] for m in minutes],
        color="tab:red",
        label="worker backends' CPU per finished job",
    )
    _finish(ax, "Database CPU of the worker connections (/proc)", "µs per job", bottom=0)
    twin = ax.twinx()
    twin.plot(
        x,
        [m["host"]["cpu_busy_pct"] for m in minutes],
        color="tab:gray",
        alpha=0.6,
        linestyle=":",
        label="whole machine busy (all users)",
    )
    twin.set_ylabel("% of all CPUs")
    twin.set_ylim(0, 100)
    _merge_legends(ax, twin)

    if extra:
        _draw_features(axes[4], x, minutes)

    for ax in axes[-1]:
        ax.set_xlabel("minute of the run")
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _draw_features(axes: Any, x: list[int], minutes: list[dict[str, Any]]) -> None:
    """The bottom row: what pruning leaves in the tables, and the limited claim and the
    workers' /metrics."""
    ax = axes[0]
    features = [m.get("features") or {} for m in minutes]
    ax.plot(
        x,
        [(m["table"]["rows"] - m["table"]["by_state"].get("dead", 0)) / 1000 for m in minutes],
        label="jobs not dead (pruned after the retention)",
        color="tab:brown",
    )
    ax.plot(
        x,
        [m["table"]["by_state"].get("dead", 0) / 1000 for m in minutes],
        label="dead jobs (never pruned automatically)",
        color="tab:red",
    )
    ax.plot(
        x,
        [f.get("django_gator_workflow_step", 0) / 1000 for f in features],
        label="workflow steps",
        color="tab:purple",
        linestyle="--",
    )
    ax.plot(
        x,
        [f.get("django_gator_batch", 0) / 1000 for f in features],
        label="batches",
        color="tab:olive",
        linestyle="--",
    )
    _finish(ax, "Rows left by pruning", "thousands", bottom=0)
    twin = ax.twinx()
    twin.plot(
        x,
        [(f.get("flow_start") or {}).get("rows") for f in features],
        color="tab:cyan",
        label="rate-limit ledger rows",
    )
    twin.plot(
        x,
        [(f.get("flow_start") or {}).get("stale_rows") for f in features],
        color="tab:blue",
        linestyle=":",
        label="ledger rows past their window",
    )
    twin.set_ylabel("ledger rows")
    twin.set_ylim(bottom=0)
    _merge_legends(ax, twin)

    ax = axes[1]
    ax.plot(
        x,
        [m["flow_lock"]["p50"] if m.get("flow_lock") else None for m in minutes],
        label="limited claim: queue-row lock p50",
        color="tab:blue",
    )
    ax.plot(
        x,
        [m["flow_lock"]["p99"] if m.get("flow_lock") else None for m in minutes],
        label="p99",
        color="tab:blue",
        linestyle="--",
    )
    _finish(ax, "Limited claim, and the workers' /metrics", "ms", log=True)
    twin = ax.twinx()
    totals = [sum(s.get("finished_total", 0) for s in m.get("metrics") or []) for m in minutes]
    growth = [b - a for a, b in itertools.pairwise([0, *totals])]
    twin.plot(
        x,
        [g / 60 for g in growth],
        color="tab:green",
        alpha=0.7,
        label="gator_jobs_finished_total, increase per s",
    )
    twin.set_ylabel("finished attempts/s (/metrics)")
    twin.set_ylim(bottom=0)
    _merge_legends(ax, twin)


def _finish(
    ax: Any, title: str, unit: str, *, log: bool = False, bottom: float | None = None
) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_title(title, fontsize=11)
    ax.set_ylabel(unit)
    values = [
        v for line in ax.get_lines() for v in line.get_ydata() if v is not None and v == v and v > 0
    ]
    top = max(values, default=1.0)
    if log:
        # Room above the data for the legend; ticks at 1, 2, 5 x 10^n written plainly.
        low = min(values, default=1.0)
        ax.set_yscale("log")
        ax.set_ylim(low / 1.5, top * 4)
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    elif bottom is not None:
        ax.set_ylim(bottom, top * 1.35)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9, loc="upper left")


def _merge_legends(ax: Any, twin: Any) -> None:
    lines, labels = ax.get_legend_handles_labels()
    more, more_labels = twin.get_legend_handles_labels()
    ax.legend(lines + more, labels + more_labels, fontsize=9, loc="upper left")
