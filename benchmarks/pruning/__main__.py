"""``python -m benchmarks.pruning``: the claim and the admin on a jobs table that has seen
5,000,000 jobs, before and after the automatic pruner's pass.

On a throwaway PostgreSQL cluster (initdb into a temporary directory, its own port,
autovacuum on; never the shared server): ``--rows`` finished jobs (98 % succeeded, 2 %
cancelled) finished evenly over the past ``--days`` days, plus ``--ready`` due jobs. Then,
before pruning, right after one pass of the pruner (worker/pruner.py, retention 7 days:
about 80 % of the rows go) and after VACUUM ANALYZE:

- the claim: ``engine.claim(worker, "default", 10)``, timed (p50, p95 of ``--claims``
  calls), and an EXPLAIN (ANALYZE, BUFFERS) of the full claim of one job;
- the admin's Job changelist (the default list, and filtered to waiting jobs and to
  succeeded jobs), through Django's test client as a superuser: p50 of 5 requests;
- during the pruning pass, a claim of one job every 0.1 s from another connection;
- before pruning, what a migration costs on the full table: a partial index like the
  claim's, and a NOT NULL column with a default.

Prints a JSON report (and writes it with ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.soak.cluster import ThrowawayCluster, recreate_database, server_facts

STEP = 500_000


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pruning", description=__doc__)
    p.add_argument("--rows", type=int, default=5_000_000, help="finished jobs (default 5M)")
    p.add_argument("--days", type=int, default=35, help="spread of finished_at, in days")
    p.add_argument("--ready", type=int, default=50_000, help="due jobs to claim from")
    p.add_argument("--claims", type=int, default=200, help="timed claims per measurement")
    p.add_argument("--port", type=int, default=5497, help="port of the throwaway cluster")
    p.add_argument("--pg-bindir", default="/usr/lib/postgresql/15/bin")
    p.add_argument("--out", type=Path, help="JSON report")
    return p


def fill(cursor: Any, rows: int, days: int, ready: int) -> float:
    started = time.perf_counter()
    span = days * 86400
    for start in range(0, rows, STEP):
        cursor.execute(
            "INSERT INTO django_gator_job (name, args, kwargs, queue, priority, "
            "next_execution_at, state, attempts, rescues, created_at, started_at, finished_at, "
            "last_error, errors, reserved_by) "
            "SELECT 'bench.history', '[1, 2]', '{}', 'default', 0, t, "
            "CASE WHEN i %% 50 = 0 THEN 'cancelled' ELSE 'succeeded' END, 1, 0, t, t, t, "
            "'', '[]', 'bench' FROM (SELECT i, now() - (%s::float8 * i / %s) * "
            "interval '1 second' AS t FROM generate_series(%s, %s) AS i) AS s",
            [span, rows, start + 1, min(start + STEP, rows)],
        )
        print(f"  {min(start + STEP, rows):,} rows", flush=True)
    cursor.execute(
        "INSERT INTO django_gator_job (name, args, kwargs, queue, priority, next_execution_at, "
        "state, attempts, rescues, created_at, last_error) "
        "SELECT 'bench.ready', '[]', '{}', 'default', 0, now() - interval '1 minute', "
        "'waiting', 0, 0, now(), '' FROM generate_series(1, %s)",
        [ready],
    )
    cursor.execute("ANALYZE django_gator_job")
    return time.perf_counter() - started


def time_ddl(cursor: Any) -> dict[str, float]:
    """What an upgrade's migration would cost on this table: seconds for a partial index
    like the claim's (built by reading the whole table, writes blocked meanwhile), and for
    adding a NOT NULL column with a default (a catalogue change); each undone after."""
    timings = {}
    for label, do, undo in (
        (
            "create_partial_index_s",
            "CREATE INDEX bench_ready ON django_gator_job (queue, priority DESC, "
            "next_execution_at, id) WHERE state IN ('waiting', 'failed')",
            "DROP INDEX bench_ready",
        ),
        (
            "add_column_with_default_s",
            "ALTER TABLE django_gator_job ADD COLUMN bench_x integer NOT NULL DEFAULT 0",
            "ALTER TABLE django_gator_job DROP COLUMN bench_x",
        ),
    ):
        started = time.perf_counter()
        cursor.execute(do)
        timings[label] = round(time.perf_counter() - started, 3)
        cursor.execute(undo)
    return timings


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(claims: int) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    from benchmarks.soak.measure import probe_claim
    from django_gator.engines import get_engine

    engine = get_engine("default")
    times = []
    for _ in range(claims):
        started = time.perf_counter()
        engine.claim("bench-worker", "default", 10)
        times.append((time.perf_counter() - started) * 1000)
    plan = probe_claim(connection, engine, "default")
    client = Client()
    client.force_login(get_user_model().objects.get(username="bench"))
    pages = {}
    for label, query in (
        ("changelist", ""),
        ("waiting", "?state__exact=waiting"),
        ("succeeded", "?state__exact=succeeded"),
    ):
        took = []
        for _ in range(6):
            started = time.perf_counter()
            response = client.get(f"/admin/django_gator/job/{query}")
            took.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, response.status_code
        pages[label] = round(statistics.median(took[1:]), 1)  # the first one warms up
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_live_tup, n_dead_tup, pg_total_relation_size('django_gator_job'), "
            "pg_relation_size('django_gator_job') FROM pg_stat_user_tables "
            "WHERE relname = 'django_gator_job'"
        )
        live, dead, total_size, heap_size = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM django_gator_job")
        rows = cursor.fetchone()[0]
    return {
        "rows": rows,
        "live_tuples": live,
        "dead_tuples": dead,
        "table_mb": round(heap_size / 2**20),
        "table_with_indexes_mb": round(total_size / 2**20),
        "claim_10_ms": {
            "p50": round(percentile(times, 0.5), 3),
            "p95": round(percentile(times, 0.95), 3),
        },
        "claim_plan": plan,
        "admin_ms": pages,
    }


def prune_with_probe() -> dict[str, Any]:
    """One pass of the pruner, and a claim of one job every 0.1 s meanwhile."""
    from django.db import connections

    from django_gator.engines import get_engine
    from django_gator.worker.pruner import Pruner

    engine = get_engine("default")
    done = threading.Event()
    probes: list[float] = []

    def probe() -> None:
        try:
            while not done.wait(0.1):
                started = time.perf_counter()
                engine.claim("probe-worker", "default", 1)
                probes.append((time.perf_counter() - started) * 1000)
        finally:
            connections.close_all()

    thread = threading.Thread(target=probe)
    thread.start()
    started = time.perf_counter()
    try:
        deleted = Pruner(engine, "bench-pruner").prune_once()
    finally:
        done.set()
        thread.join()
    seconds = time.perf_counter() - started
    return {
        "deleted": deleted,
        "seconds": round(seconds, 1),
        "rows_per_s": round((deleted or 0) / seconds),
        "probe_claims": len(probes),
        "probe_claim_1_ms": {
            "p50": round(percentile(probes, 0.5), 3),
            "p95": round(percentile(probes, 0.95), 3),
            "max": round(max(probes), 3),
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    cluster = ThrowawayCluster(args.port, args.pg_bindir)
    try:
        url = cluster.start("gator_soak_prune")
        print(f"throwaway cluster in {cluster.directory}, port {args.port}", flush=True)
        recreate_database(url)
        os.environ["DATABASE_URL"] = url
        os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.pruning.settings"
        import django

        django.setup()
        from django.contrib.auth import get_user_model
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
        report: dict[str, Any] = {
            "meta": {
                "date": datetime.now(UTC).isoformat(timespec="seconds"),
                "host": platform.node(),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "django": django.get_version(),
                "rows": args.rows,
                "days": args.days,
                "ready": args.ready,
                "retention_s": 7 * 86400,
                "command": "python -m benchmarks.pruning " + " ".join(argv or sys.argv[1:]),
            }
        }
        with connection.cursor() as cursor:
            report["meta"]["server"] = server_facts(cursor)
            print(f"filling {args.rows:,} finished jobs and {args.ready:,} ready ones", flush=True)
            report["fill_s"] = round(fill(cursor, args.rows, args.days, args.ready), 1)
            report["ddl"] = time_ddl(cursor)
            print(json.dumps(report["ddl"]), flush=True)
        print("measuring before pruning", flush=True)
        report["before"] = measure(args.claims)
        print(json.dumps(report["before"]), flush=True)
        print("pruning", flush=True)
        report["prune"] = prune_with_probe()
        print(json.dumps(report["prune"]), flush=True)
        report["after_prune"] = measure(args.claims)
        print(json.dumps(report["after_prune"]), flush=True)
        with connection.cursor() as cursor:
            started = time.perf_counter()
            cursor.execute("VACUUM ANALYZE django_gator_job")
            report["vacuum_s"] = round(time.perf_counter() - started, 1)
        report["after_vacuum"] = measure(args.claims)
        print(json.dumps(report["after_vacuum"]), flush=True)
        connection.close()
    finally:
        cluster.stop()
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
