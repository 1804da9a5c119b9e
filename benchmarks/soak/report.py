"""``python -m benchmarks.soak --markdown REPORT.json``: the first-ten against last-ten
minutes table of a soak report, as docs/benchmarks.md shows it."""

from __future__ import annotations

import statistics
from typing import Any


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}".rstrip("0").rstrip(".") if digits else f"{value:.0f}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"x{b / a:.2f}" if a and b is not None else "-"


def comparison(document: dict[str, Any]) -> str:
    """Markdown rows: quantity | first N minutes | last N minutes | last / first."""
    summary = document["summary"]
    minutes = [m for m in document["minutes"] if not m.get("partial")]
    span = summary["compared_minutes"]
    first, last = minutes[:span], minutes[-span:]
    rows: list[tuple[str, float | None, float | None, int]] = []
    for name, label in (("claim", "claim"), ("mark", "success mark")):
        for q in ("p50", "p99"):
            rows.append(
                (
                    f"{label} latency {q}, ms (worker-side, pooled)",
                    summary[name]["first"][q],
                    summary[name]["last"][q],
                    2,
                )
            )
    for name, label in (("claim", "full claim, 1 job"), ("mark", "success mark, 8 jobs")):
        for key, unit, digits in (("buffers", "buffers", 0), ("ms", "ms", 3)):
            rows.append(
                (
                    f"EXPLAIN probe, {label}: {unit} (median)",
                    _median([(m["probe"].get(name) or {}).get(key) for m in first]),
                    _median([(m["probe"].get(name) or {}).get(key) for m in last]),
                    digits,
                )
            )
    if minutes and minutes[0].get("pgss"):
        for name, label in (("claim", "full claim"), ("mark", "success mark")):
            rows.append(
                (
                    f"{label}, server execution ms per call (pg_stat_statements)",
                    _median([(m["pgss"].get(name) or {}).get("mean_ms") for m in first]),
                    _median([(m["pgss"].get(name) or {}).get("mean_ms") for m in last]),
                    3,
                )
            )
    rows.append(
        (
            "worker backends' CPU per finished job, us (median of minutes)",
            _median([m["worker_db_cpu_us_per_job"] for m in first]),
            _median([m["worker_db_cpu_us_per_job"] for m in last]),
            0,
        )
    )
    rows.append(
        (
            "finished jobs per second (median of minutes)",
            _median(
                [sum(m["finished"].get(s, 0) for s in ("succeeded", "dead")) / 60 for m in first]
            ),
            _median(
                [sum(m["finished"].get(s, 0) for s in ("succeeded", "dead")) / 60 for m in last]
            ),
            1,
        )
    )
    rows.append(
        (
            "jobs due and waiting, max",
            max(m["backlog"]["due_max"] for m in first),
            max(m["backlog"]["due_max"] for m in last),
            0,
        )
    )
    rows.append(
        (
            "dead tuples at the window's end (n_dead_tup)",
            first[-1]["table"].get("n_dead_tup"),
            last[-1]["table"].get("n_dead_tup"),
            0,
        )
    )
    for i in range(len(minutes[0]["workers"])):
        rows.append(
            (
                f"worker {i + 1} RSS at the window's end, MiB",
                first[-1]["workers"][i]["rss_mb"],
                last[-1]["workers"][i]["rss_mb"],
                1,
            )
        )
        rows.append(
            (
                f"worker {i + 1} threads, max",
                max(m["workers"][i]["threads_max"] for m in first),
                max(m["workers"][i]["threads_max"] for m in last),
                0,
            )
        )
    if first[0].get("flow_lock"):
        for q in ("p50", "p99"):
            rows.append(
                (
                    f"limited claim, lock of the queue's row {q}, ms (median of minutes)",
                    _median([m["flow_lock"][q] for m in first]),
                    _median([m["flow_lock"][q] for m in last]),
                    2,
                )
            )
    rows.append(
        (
            "load average (1 min), median of minutes",
            _median([m["host"]["loadavg"] for m in first]),
            _median([m["host"]["loadavg"] for m in last]),
            1,
        )
    )
    out = [
        f"| | first {span} min | last {span} min | last / first |",
        "|---|---:|---:|---:|",
    ]
    for label, a, b, digits in rows:
        out.append(f"| {label} | {_fmt(a, digits)} | {_fmt(b, digits)} | {_ratio(a, b)} |")
    if any(m.get("features") for m in minutes):
        out += ["", over_time(document)]
    if summary.get("checks"):
        out += ["", checks(document)]
    return "\n".join(out)


def over_time(document: dict[str, Any], every: int = 10) -> str:
    """Markdown rows, every ``every`` minutes: what pruning leaves in the tables."""
    out = [
        "| minute | jobs (not dead) | dead jobs | pruned so far | rate-limit ledger rows "
        "(past window) | batches | workflows (steps) | load average |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    minutes = [m for m in document["minutes"] if not m.get("partial") and m.get("features")]
    for m in minutes[every - 1 :: every]:
        table, extra = m["table"], m["features"]
        dead = table["by_state"].get("dead", 0)
        flow = extra["flow_start"]
        out.append(
            f"| {m['minute']} | {table['rows'] - dead:,} | {dead:,} | "
            f"{sum(extra['deleted_by_state'].values()):,} | {flow['rows']:,} "
            f"({flow['stale_rows']:,}) | {extra['django_gator_batch']:,} | "
            f"{extra['django_gator_workflow']:,} ({extra['django_gator_workflow_step']:,}) | "
            f"{m['host']['loadavg']:.1f} |"
        )
    return "\n".join(out)


def checks(document: dict[str, Any]) -> str:
    """The report's checks as a Markdown list."""
    out = []
    for check in document["summary"]["checks"]:
        detail = check["detail"].replace("\n", "; ")
        out.append(f"- **{'PASS' if check['ok'] else 'FAIL'}: {check['name']}.** {detail}")
    return "\n".join(out)


def windows(document: dict[str, Any]) -> str:
    """Markdown rows of a --long-transaction report's windows."""
    out = [
        "| window | jobs | seconds | worker backends' CPU per job | claim p50 / p99 (ms) "
        "| full-claim probe, buffers | mark probe (8 jobs), buffers |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in document["summary"].get("windows", []):
        probe = w["probe"]
        out.append(
            f"| {w['window']} | {w['jobs']:,} | {w['seconds']:.0f} | "
            f"{w['worker_db_cpu_us_per_job']:,} us | {w['claim']['p50']} / {w['claim']['p99']} | "
            f"{_fmt((probe.get('claim') or {}).get('buffers'), 0)} | "
            f"{_fmt((probe.get('mark') or {}).get('buffers'), 0)} |"
        )
    return "\n".join(out)
