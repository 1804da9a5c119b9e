"""``python -m benchmarks.queue_figures``: what one refresh of the Prometheus view's queue
figures costs PostgreSQL on a jobs table of about a million finished jobs and a few
thousand live ones, read the old way and the new way.

- *old*: ``db_now()`` and what ``stats.queue_stats()`` sent at 705985b (what
  ``metrics._read_figures`` read until the change that made it one statement; kept here
  as it was): five statements, the figures of ``gator_status`` (ready/scheduled/oldest,
  failed/running/dead, the last hour's outcomes, the queue table);
- *new*: ``engine.queue_gauges()``, one statement (engines/gauges.py).

On a throwaway cluster (initdb into a temporary directory, its own port; never the shared
server): ``--finished`` finished jobs (98.5 % succeeded, 0.5 % cancelled, 1 % dead) over
the past 7 days, spread over 8 queues, and ``--live`` live ones (waiting due now and
later, some with a concurrency key, failed due now and later, running). Each statement is
run under EXPLAIN (ANALYZE, BUFFERS) (server time, shared buffers hit and read, the plan),
and each way is timed from Python ``--reps`` times, alternated (old, new, old, ...): once
right after the fill with ANALYZE only (the visibility map is empty: index-only scans
still visit the heap, as on a busy table between vacuums), once after VACUUM ANALYZE.
Prints a JSON report (and writes it with ``--out``) and the plans (``--plans FILE``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.soak.cluster import (
    ThrowawayCluster,
    end_on_sigterm,
    migrated_django,
    run_facts,
    server_facts,
    throwaway_arguments,
)

QUEUES = 8


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.queue_figures", description=__doc__)
    p.add_argument("--finished", type=int, default=1_000_000, help="finished jobs")
    p.add_argument("--live", type=int, default=4_000, help="waiting, failed and running jobs")
    p.add_argument("--reps", type=int, default=30, help="timed refreshes of each way")
    throwaway_arguments(p, 5493)
    p.add_argument("--plans", type=Path, help="text file for the EXPLAIN output")
    return p


COLUMNS = (
    "name, args, kwargs, queue, priority, next_execution_at, state, attempts, rescues, "
    "created_at, started_at, finished_at, last_error, errors, reserved_by, locked_at, "
    "concurrency_key"
)


def fill(cursor: Any, finished: int, live: int) -> None:
    """``finished`` finished jobs over 7 days and ``live`` live ones, in 8 queues."""
    week = 7 * 86400
    step = 250_000
    for start in range(0, finished, step):
        cursor.execute(
            f"INSERT INTO django_gator_job ({COLUMNS}) "
            f"SELECT 'bench.history', '[]', '{{}}', 'q' || (i %% {QUEUES}), 0, t, "
            "CASE WHEN i %% 100 = 0 THEN 'dead' WHEN i %% 200 = 1 THEN 'cancelled' "
            "ELSE 'succeeded' END, 1, 0, t, t, t, '', '[]', 'bench', t, NULL "
            "FROM (SELECT i, now() - (%s::float8 * i / %s) * interval '1 second' AS t "
            "FROM generate_series(%s, %s) AS i) AS s",
            [week, finished, start + 1, min(start + step, finished)],
        )
    # The live jobs: of every 20, 10 waiting due now (one with a key), 4 waiting due
    # later (one with a key), 2 failed due now, 2 failed due later, 2 running.
    cursor.execute(
        f"INSERT INTO django_gator_job ({COLUMNS}) "
        f"SELECT 'bench.live', '[]', '{{}}', 'q' || (i %% {QUEUES}), 0, "
        "CASE WHEN k IN (10, 11, 12, 13, 16, 17) THEN now() + interval '1 hour' "
        "ELSE now() - (i %% 600) * interval '1 second' END, "
        "CASE WHEN k < 14 THEN 'waiting' WHEN k < 18 THEN 'failed' ELSE 'running' END, "
        "CASE WHEN k < 14 THEN 0 ELSE 1 END, 0, now(), NULL, NULL, '', '[]', "
        "CASE WHEN k >= 18 THEN 'bench-worker' END, CASE WHEN k >= 18 THEN now() END, "
        "CASE WHEN k IN (0, 10) THEN 'key:' || i END "
        "FROM (SELECT i, i %% 20 AS k FROM generate_series(1, %s) AS i) AS s",
        [live],
    )


def old_refresh(alias: str = "default") -> list[Any]:
    """The figures as metrics._read_figures read them before the change (db_now, then
    stats.queue_stats() as it was at 705985b: these four statements)."""
    from datetime import timedelta

    from django.db.models import Count, Min, Q

    from django_gator.engines import get_engine
    from django_gator.models import READY_STATES, Job, JobState, Queue
    from django_gator.stats import QueueStats

    now = get_engine(alias).db_now()
    jobs = Job.objects.using(alias).order_by()
    by_queue: dict[str, QueueStats] = {}

    def entry(queue: str) -> QueueStats:
        return by_queue.setdefault(queue, QueueStats(queue=queue))

    for row in (
        jobs.filter(state__in=READY_STATES)
        .values("queue")
        .annotate(
            ready=Count("id", filter=Q(next_execution_at__lte=now)),
            total=Count("id"),
            oldest=Min("next_execution_at"),
        )
    ):
        stats = entry(row["queue"])
        stats.ready = row["ready"]
        stats.scheduled = row["total"] - row["ready"]
        if row["oldest"] is not None and row["oldest"] <= now:
            stats.oldest_due_at = row["oldest"]
    for counted in (
        jobs.filter(state__in=(JobState.FAILED, JobState.RUNNING, JobState.DEAD))
        .values("queue", "state")
        .annotate(count=Count("id"))
    ):
        setattr(entry(counted["queue"]), str(counted["state"]), counted["count"])
    for recent in (
        jobs.filter(
            state__in=(JobState.SUCCEEDED, JobState.DEAD),
            finished_at__gte=now - timedelta(hours=1),
        )
        .values("queue", "state")
        .annotate(count=Count("id"))
    ):
        setattr(entry(recent["queue"]), f"{recent['state']}_last_hour", recent["count"])
    for queue in Queue.objects.using(alias):
        entry(queue.name).paused = queue.paused
    return [by_queue[name] for name in sorted(by_queue)]


def new_refresh(alias: str = "default") -> Any:
    from django_gator.engines import get_engine

    return get_engine(alias).queue_gauges()


def statements(refresh: Any) -> list[str]:
    """The SQL ``refresh`` sends, as sent."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    connection.ensure_connection()
    with CaptureQueriesContext(connection) as captured:
        refresh()
    return [q["sql"] for q in captured.captured_queries]


def explain(sql: str) -> tuple[dict[str, Any], str]:
    """Server time and shared buffers of ``sql`` (EXPLAIN ANALYZE, BUFFERS), and its plan."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql)
        [[document]] = cursor.fetchall()
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql)
        text = "\n".join(row[0] for row in cursor.fetchall())
    doc = document if isinstance(document, list) else json.loads(document)
    top = doc[0]
    plan = top["Plan"]
    hit, read = _buffers(top)
    return {
        "execution_ms": round(top["Execution Time"], 3),
        "planning_ms": round(top["Planning Time"], 3),
        "shared_hit": hit,
        "shared_read": read,
        "heap_fetches": _heap_fetches(plan),
    }, text


def _buffers(top: dict[str, Any]) -> tuple[int, int]:
    plan = top["Plan"]
    return int(plan.get("Shared Hit Blocks", 0)), int(plan.get("Shared Read Blocks", 0))


def _heap_fetches(node: dict[str, Any]) -> int:
    own = int(node.get("Heap Fetches", 0))
    return own + sum(_heap_fetches(child) for child in node.get("Plans", []))


def measure(reps: int, label: str, plans: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for way, refresh in (("old", old_refresh), ("new", new_refresh)):
        parts = []
        for sql in statements(refresh):
            figures, text = explain(sql)
            parts.append(figures)
            plans.append(f"-- {label}, {way}\n{sql}\n{text}\n")
        result[way] = {
            "statements": len(parts),
            "execution_ms": round(sum(p["execution_ms"] for p in parts), 3),
            "planning_ms": round(sum(p["planning_ms"] for p in parts), 3),
            "shared_hit": sum(p["shared_hit"] for p in parts),
            "shared_read": sum(p["shared_read"] for p in parts),
            "heap_fetches": sum(p["heap_fetches"] for p in parts),
            "per_statement": parts,
        }
    took: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(reps):
        for way, refresh in (("old", old_refresh), ("new", new_refresh)):
            started = time.perf_counter()
            refresh()
            took[way].append((time.perf_counter() - started) * 1000)
    for way, values in took.items():
        ordered = sorted(values)
        result[way]["wall_ms"] = {
            "median": round(statistics.median(values), 3),
            "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 3),
            "min": round(ordered[0], 3),
        }
    result["wall_ratio_new_to_old"] = round(
        result["new"]["wall_ms"]["median"] / result["old"]["wall_ms"]["median"], 3
    )
    return result


def check_same_figures() -> None:
    """The new statement's figures are the old ones' (those they share)."""
    _now, gauges = new_refresh()
    old = {q.queue: q for q in old_refresh()}
    for g in gauges:
        o = old[g.queue]
        assert (g.ready, g.scheduled, g.running, g.dead, g.paused) == (
            o.ready,
            o.scheduled,
            o.running,
            o.dead,
            o.paused,
        ), (g, o)
        assert g.oldest_due_at == o.oldest_due_at, (g, o)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    end_on_sigterm()
    cluster = ThrowawayCluster(args.port, args.pg_bindir)
    try:
        url = cluster.start("gator_soak_figures")
        migrated_django(url, "benchmarks.pruning.settings")
        from django.db import connection

        command = "python -m benchmarks.queue_figures " + " ".join(argv or sys.argv[1:])
        report: dict[str, Any] = {"meta": run_facts(command)}
        report["meta"] |= {"finished": args.finished, "live": args.live}
        with connection.cursor() as cursor:
            report["meta"]["server"] = server_facts(cursor)
            started = time.perf_counter()
            fill(cursor, args.finished, args.live)
            cursor.execute("ANALYZE django_gator_job")
            report["fill_s"] = round(time.perf_counter() - started, 1)
        check_same_figures()
        plans: list[str] = []
        report["analyzed"] = measure(args.reps, "analyzed, not vacuumed", plans)
        print(json.dumps(report["analyzed"]["new"]["wall_ms"]), flush=True)
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE django_gator_job")
        report["vacuumed"] = measure(args.reps, "after VACUUM ANALYZE", plans)
        report["meta"]["load_average_end"] = os.getloadavg()
        connection.close()
    finally:
        cluster.stop()
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    if args.plans:
        args.plans.write_text("\n".join(plans))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
