"""``python -m benchmarks.pruning``: the claim and every admin page on a jobs table that
has seen 5,000,000 jobs, before and after the automatic pruner's pass.

On a throwaway PostgreSQL cluster (initdb into a temporary directory, its own port,
autovacuum on; never the shared server): ``--rows`` finished jobs finished evenly over the
past ``--days`` days (97.8 % succeeded, 2 % cancelled, 0.2 % dead in 16 error classes;
eight job names and one rare one, 50 rows; queues ``default`` 80 %, ``emails`` 15 %,
``reports`` 5 % and ``rare``, 30 rows; the newest 10,000 are the members of one batch),
plus ``--ready`` due jobs, 1,000 failed ones, 400 running ones and 4 workers. Then, before
pruning, right after one pass of the pruner (worker/pruner.py, retention 7 days: about
80 % of the rows go) and after VACUUM ANALYZE:

- the claim: ``engine.claim(worker, "default", 10)``, timed (p50, p95 of ``--claims``
  calls), and an EXPLAIN (ANALYZE, BUFFERS) of the full claim of one job;
- every admin page (:data:`PAGES`: the dashboard, the job list unfiltered, filtered by
  state, queue and job name, searched, paged deep, a job's page, the batch page, the
  dead-job screen, the worker, workflow and schedule lists), through Django's test client
  as a superuser: the median of 5 requests after one that warms up (2 after it for a page
  slower than 2 s), with the page's statements and the slowest one's time;
- during the pruning pass, a claim of one job every 0.1 s from another connection;
- before pruning, what a migration costs on the full table: a partial index like the
  claim's, and a NOT NULL column with a default.

``--pages-only`` stops after the first measurement (no pruning). Prints a JSON report (and
writes it with ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from typing import Any

from benchmarks.pruning.jobs import NAMES, RARE
from benchmarks.soak.cluster import (
    ThrowawayCluster,
    end_on_sigterm,
    migrated_django,
    run_facts,
    server_facts,
    throwaway_arguments,
)

STEP = 500_000


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pruning", description=__doc__)
    p.add_argument("--rows", type=int, default=5_000_000, help="finished jobs (default 5M)")
    p.add_argument("--days", type=int, default=35, help="spread of finished_at, in days")
    p.add_argument("--ready", type=int, default=50_000, help="due jobs to claim from")
    p.add_argument("--claims", type=int, default=200, help="timed claims per measurement")
    throwaway_arguments(p, 5497)
    p.add_argument(
        "--pages-only", action="store_true", help="measure before pruning only, then stop"
    )
    return p


RARE_NAME = f"app.jobs.{RARE}"
ERRORS = (
    "TimeoutError",
    "ConnectionError",
    "ValueError",
    "KeyError",
    "PermissionError",
    "RuntimeError",
    "OSError",
    "LookupError",
    "TypeError",
    "ZeroDivisionError",
    "IndexError",
    "AttributeError",
    "ProtocolError",
    "HTTPError",
    "IntegrityError",
    "DataError",
)
#: Members of the benchmark's batch: the newest finished jobs.
BATCH_MEMBERS = 10_000


def fill(cursor: Any, rows: int, days: int, ready: int, batch_id: int) -> float:
    started = time.perf_counter()
    span = days * 86400
    names = "ARRAY[" + ", ".join(f"'app.jobs.{n}'" for n in NAMES) + "]"
    errors = "ARRAY[" + ", ".join(f"'{e}'" for e in ERRORS) + "]"
    for start in range(0, rows, STEP):
        cursor.execute(
            "INSERT INTO django_gator_job (name, args, kwargs, queue, priority, "
            "next_execution_at, state, attempts, rescues, created_at, started_at, finished_at, "
            "last_error, error_class, errors, reserved_by, batch_id) "
            f"SELECT CASE WHEN i %% 100000 = 7 THEN '{RARE_NAME}' "
            f"ELSE ({names})[1 + i %% {len(NAMES)}] END, "
            "('[' || i || ', \"user-' || (i %% 9973) || '\"]')::jsonb, '{}', "
            "CASE WHEN i %% 166667 = 3 THEN 'rare' WHEN i %% 20 < 16 THEN 'default' "
            "WHEN i %% 20 < 19 THEN 'emails' ELSE 'reports' END, 0, t, "
            "CASE WHEN i %% 500 = 1 THEN 'dead' WHEN i %% 50 = 0 THEN 'cancelled' "
            "ELSE 'succeeded' END, CASE WHEN i %% 500 = 1 THEN 3 ELSE 1 END, 0, t, t, t, "
            f"CASE WHEN i %% 500 = 1 THEN ({errors})[1 + i %% {len(ERRORS)}] || "
            "': upstream answered 503 for user-' || (i %% 9973) ELSE '' END, "
            f"CASE WHEN i %% 500 = 1 THEN ({errors})[1 + i %% {len(ERRORS)}] END, "
            'CASE WHEN i %% 500 = 1 THEN (\'[{"attempt": 3, "class": "\' || '
            f"({errors})[1 + i %% {len(ERRORS)}] || "
            '\'", "message": "upstream answered 503", "traceback": "Traceback"}]\')'
            "::jsonb ELSE '[]' END, 'bench', "
            f"CASE WHEN i > %s - {BATCH_MEMBERS} THEN %s::bigint END "
            # Ids grow with time, as dispatch makes them: the last row finished just now.
            "FROM (SELECT i, now() - (%s::float8 * (%s - i) / %s) * "
            "interval '1 second' AS t FROM generate_series(%s, %s) AS i) AS s",
            [rows, batch_id, span, rows, rows, start + 1, min(start + STEP, rows)],
        )
        print(f"  {min(start + STEP, rows):,} rows", flush=True)
    cursor.execute(
        "INSERT INTO django_gator_job (name, args, kwargs, queue, priority, next_execution_at, "
        "state, attempts, rescues, created_at, last_error) "
        "SELECT 'bench.ready', '[]', '{}', CASE WHEN i <= 2 THEN 'rare' ELSE 'default' END, 0, "
        "now() - interval '1 minute', 'waiting', 0, 0, now(), '' "
        "FROM generate_series(1, %s) AS i",
        [ready],
    )
    cursor.execute(
        "INSERT INTO django_gator_job (name, args, kwargs, queue, priority, next_execution_at, "
        "state, attempts, rescues, created_at, started_at, last_error, error_class, errors, "
        "reserved_by, locked_at) "
        f"SELECT ({names})[1 + i %% {len(NAMES)}], '[]', '{{}}', "
        "CASE WHEN i %% 2 = 0 THEN 'emails' ELSE 'reports' END, 0, "
        "CASE WHEN i <= 1000 THEN now() + interval '5 minutes' ELSE now() END, "
        "CASE WHEN i <= 1000 THEN 'failed' ELSE 'running' END, 1, 0, now(), now(), "
        "CASE WHEN i <= 1000 THEN 'TimeoutError: upstream' ELSE '' END, "
        "CASE WHEN i <= 1000 THEN 'TimeoutError' END, '[]', "
        "'bench-host:' || (i %% 4) || ':worker', now() FROM generate_series(1, 1400) AS i",
        [],
    )
    cursor.execute(
        "INSERT INTO django_gator_worker (id, hostname, pid, queues, concurrency, supervisor, "
        "started_at, heartbeat_at) SELECT 'bench-host:' || i || ':worker', 'bench-host', i, "
        "'[]', 100, '', now(), now() FROM generate_series(0, 3) AS i"
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


#: The admin pages measured: (label, path under /admin/django_gator/). ``{dead}``: a dead
#: job's id; ``{batch}``: the batch's id.
PAGES = (
    ("dashboard", "job/dashboard/"),
    ("job list", "job/"),
    ("job list, state=succeeded", "job/?state__exact=succeeded"),
    ("job list, state=dead", "job/?state__exact=dead"),
    ("job list, state=waiting", "job/?state__exact=waiting"),
    ("job list, queue=emails (15 %)", "job/?queue=emails"),
    ("job list, queue=rare (32 rows)", "job/?queue=rare"),
    ("job list, name=SendEmail (12 %)", "job/?name=app.jobs.SendEmail"),
    (f"job list, name={RARE_NAME} (50 rows)", f"job/?name={RARE_NAME}"),
    ("job list, error class=TimeoutError (625 rows)", "job/?error_class=TimeoutError"),
    ("job list, page 200", "job/?p=200"),
    ("job list, search a job id", "job/?q={dead}"),
    ("job list, search ResizeImage", "job/?q=ResizeImage"),
    ("job list, search user-4242 (args)", "job/?q=user-4242"),
    ("job list, search matching nothing", "job/?q=no-such-text"),
    ("job page (dead, with errors)", "job/{dead}/change/"),
    ("batch page (10,000 members)", "job/batches/{batch}/"),
    ("batch page, dead members", "job/batches/{batch}/?state=dead"),
    ("dead-job screen", "job/dead/"),
    ("worker list", "worker/"),
    ("workflow list", "workflowrun/"),
    ("schedule list", "schedule/"),
)


def time_pages(ids: dict[str, int]) -> dict[str, Any]:
    """Each page of PAGES: median ms, the number of statements, the slowest one's ms."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.force_login(get_user_model().objects.get(username="bench"))
    pages: dict[str, Any] = {}
    for label, path in PAGES:
        url = "/admin/django_gator/" + path.format(**ids)
        took = []
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            response = client.get(url)
            took.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
        # (read now: the next request's request_started signal empties the query log)
        statements = len(captured.captured_queries)
        slowest = max(captured.captured_queries, key=lambda q: float(q["time"]))
        reps = 5 if took[0] < 2000 else 2
        took = []  # the first request warms up
        for _ in range(reps):
            started = time.perf_counter()
            response = client.get(url)
            took.append((time.perf_counter() - started) * 1000)
        pages[label] = {
            "ms": round(statistics.median(took), 1),
            "max_ms": round(max(took), 1),
            "statements": statements,
            "slowest_statement_ms": round(float(slowest["time"]) * 1000, 1),
            "slowest_statement": slowest["sql"][:300],
        }
        print(f"    {label}: {pages[label]['ms']} ms", flush=True)
    return pages


def measure(claims: int, ids: dict[str, int]) -> dict[str, Any]:
    from django.db import connection

    from benchmarks.soak.measure import probe_claim
    from django_gator.engines import get_engine

    engine = get_engine("default")
    times = []
    for _ in range(claims):
        started = time.perf_counter()
        engine.claim("bench-worker", "default", 10)
        times.append((time.perf_counter() - started) * 1000)
    plan = probe_claim(connection, engine, "default")
    pages = time_pages(ids)
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
        "load_average": os.getloadavg(),
        "claim_10_ms": {
            "p50": round(percentile(times, 0.5), 3),
            "p95": round(percentile(times, 0.95), 3),
        },
        "claim_plan": plan,
        "admin_ms": {label: page["ms"] for label, page in pages.items()},
        "admin": pages,
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
    end_on_sigterm()
    cluster = ThrowawayCluster(args.port, args.pg_bindir)
    try:
        url = cluster.start("gator_soak_prune")
        print(f"throwaway cluster in {cluster.directory}, port {args.port}", flush=True)
        migrated_django(url, "benchmarks.pruning.settings")
        from django.contrib.auth import get_user_model
        from django.db import connection

        get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
        from django_gator.models import Batch

        batch = Batch.objects.create(description="bench", size=BATCH_MEMBERS, closed=True)
        command = "python -m benchmarks.pruning " + " ".join(argv or sys.argv[1:])
        report: dict[str, Any] = {"meta": run_facts(command)}
        report["meta"] |= {
            "rows": args.rows,
            "days": args.days,
            "ready": args.ready,
            "retention_s": 7 * 86400,
        }
        with connection.cursor() as cursor:
            report["meta"]["server"] = server_facts(cursor)
            print(f"filling {args.rows:,} finished jobs and {args.ready:,} ready ones", flush=True)
            report["fill_s"] = round(fill(cursor, args.rows, args.days, args.ready, batch.pk), 1)
            # A dead job of the last week (pruning keeps it): the job page and the id search.
            cursor.execute(
                "SELECT max(id) FROM django_gator_job WHERE state = 'dead' "
                "AND finished_at > now() - interval '1 day'"
            )
            ids = {"dead": cursor.fetchone()[0], "batch": batch.pk}
            if not args.pages_only:
                report["ddl"] = time_ddl(cursor)
                print(json.dumps(report["ddl"]), flush=True)
        print("measuring before pruning", flush=True)
        report["before"] = measure(args.claims, ids)
        print(json.dumps(report["before"]["admin_ms"]), flush=True)
        if not args.pages_only:
            print("pruning", flush=True)
            report["prune"] = prune_with_probe()
            print(json.dumps(report["prune"]), flush=True)
            report["after_prune"] = measure(args.claims, ids)
            print(json.dumps(report["after_prune"]["admin_ms"]), flush=True)
            with connection.cursor() as cursor:
                started = time.perf_counter()
                cursor.execute("VACUUM ANALYZE django_gator_job")
                report["vacuum_s"] = round(time.perf_counter() - started, 1)
            report["after_vacuum"] = measure(args.claims, ids)
            print(json.dumps(report["after_vacuum"]["admin_ms"]), flush=True)
        report["meta"]["load_average_end"] = os.getloadavg()
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
