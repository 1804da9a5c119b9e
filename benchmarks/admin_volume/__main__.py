"""``python -m benchmarks.admin_volume``: every admin page and a /metrics scrape, timed on a
jobs table of ``--rows`` jobs (default 20,000,000), on the plain table and on partitioned
storage (issue 32, item 4).

For each storage (``--storage plain,partitioned``) it re-creates its database (on a
throwaway PostgreSQL 15 cluster by default, cluster.py; its name must contain ``soak``),
migrates, converts the still-empty table for partitioned storage (``--partitioning``
granularity, hour by default), bulk-loads the rows (fill.py: the jobs a day's soak leaves
unfinished at any moment, 2,000 due, 1,000 scheduled, 300 failed, 100 running, and
``--backlog`` more due; the rest finished, 98 % succeeded, 1 % each cancelled and dead, over
the time a day's rate takes to make them; and the rows of the finished jobs' tallies a fleet
of 12 workers would have written for them, fill.fill_tallies), VACUUM ANALYZE (what
autovacuum would have done), then requests each page ``--repeat`` times after one untimed
request (the cold one, timed apart): the admin's through Django's test Client logged in as a
superuser (the whole view, templates included; no network), /metrics over real HTTP
(Django's WSGI handler behind wsgiref on a local port, the queue figures read at every
scrape: ``GATOR_METRICS_CACHE_SECONDS = 0``). Targets: 500 ms per admin page, 100 ms per
scrape; the report marks each median and max against them. Before loading it checks the free
disk space of the cluster's directory (about 1 KiB a row, with indexes and WAL).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.admin_volume import fill
from benchmarks.soak.cluster import (
    ThrowawayCluster,
    end_on_sigterm,
    recreate_database,
    server_facts,
)
from benchmarks.soak.day import LEAVES

ROOT = Path(__file__).resolve().parents[2]
ADMIN_TARGET_MS = 500.0
SCRAPE_TARGET_MS = 100.0
#: Bytes of disk a row takes, heap, indexes and WAL of the load together (measured at
#: 1,000,000 rows: see docs/benchmarks.md), with room to spare.
BYTES_PER_ROW = 1024
A_DAY_PER_S = 1157.0  # 100,000,000 jobs a day


def pages(context: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, URL) of every page timed."""
    base = "/admin/django_gator/job/"
    today = time.strftime("%Y-%m-%d", time.gmtime())
    tomorrow = time.strftime("%Y-%m-%d", time.gmtime(time.time() + 86400))
    workflow = context["workflows"][0]
    return [
        ("job list", base),
        ("job list, page 2", f"{base}?p=2"),
        ("filter state=waiting", f"{base}?state__exact=waiting"),
        ("filter state=succeeded", f"{base}?state__exact=succeeded"),
        ("filter state=failed", f"{base}?state__exact=failed"),
        ("filter queue=soak-limited", f"{base}?queue=soak-limited"),
        ("filter name=soak.retry", f"{base}?name=soak.retry"),
        ("filter error class=ValueError", f"{base}?error_class=ValueError"),
        ("filter finished today", f"{base}?finished_at__gte={today}&finished_at__lt={tomorrow}"),
        ("filter state+name", f"{base}?state__exact=succeeded&name=soak.web"),
        ("search 'soak.retry'", f"{base}?q=soak.retry"),
        ("search 'always fails'", f"{base}?q=always+fails"),
        ("job page (newest)", f"{base}{context['newest']}/change/"),
        ("job page (oldest)", f"{base}{context['oldest']}/change/"),
        ("dead jobs", f"{base}dead/"),
        ("dashboard", f"{base}dashboard/"),
        ("batch page", f"{base}batches/{context['batches'][0]}/"),
        ("workflow list", "/admin/django_gator/workflowrun/"),
        ("workflow page", f"/admin/django_gator/workflowrun/{workflow.pk}/change/"),
        ("worker list", "/admin/django_gator/worker/"),
    ]


class SqlTime:
    """Time spent in SQL statements by this process (a Django execute wrapper), and their
    number: what of a page's time is the database's (the rest is Python and templates)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.statements = 0

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.seconds += time.perf_counter() - started
            self.statements += 1


def timed(get: Any, repeat: int) -> dict[str, Any]:
    """One cold request, then ``repeat`` timed ones (median and max of those)."""
    from django.db import connection

    samples: list[float] = []
    sql: list[SqlTime] = []
    statuses: set[int] = set()
    for _ in range(repeat + 1):
        meter = SqlTime()
        with connection.execute_wrapper(meter):
            started = time.perf_counter()
            status = get()
            samples.append((time.perf_counter() - started) * 1000)
        sql.append(meter)
        statuses.add(status)
    warm = samples[1:]
    return {
        "cold_ms": round(samples[0], 1),
        "median_ms": round(statistics.median(warm), 1),
        "max_ms": round(max(warm), 1),
        "sql_median_ms": round(statistics.median(m.seconds * 1000 for m in sql[1:]), 1),
        "statements": sql[-1].statements,
        "statuses": sorted(statuses),
    }


def serve_metrics() -> tuple[Any, int]:
    """Django's WSGI handler on a local port in a thread (real HTTP for /metrics)."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from django.core.wsgi import get_wsgi_application

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = make_server("127.0.0.1", 0, get_wsgi_application(), handler_class=Quiet)
    threading.Thread(target=server.serve_forever, name="volume-metrics", daemon=True).start()
    return server, server.server_port


def scrape(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as reply:
        reply.read()
        return int(reply.status)


def measure_storage(url: str, storage: str, args: argparse.Namespace) -> dict[str, Any]:
    """Load one database with the rows and time every page on it."""
    from django.db import connections

    connections.close_all()
    recreate_database(url)
    partitioning = args.partitioning if storage == "partitioned" else ""
    os.environ["GATOR_SOAK_PARTITIONING"] = partitioning
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    settings.GATOR_PARTITIONING = partitioning or None
    call_command("migrate", verbosity=0)
    spread = args.rows / A_DAY_PER_S
    context = fill.companions()
    if partitioning:
        with connection.cursor() as cursor:
            fill.seed_oldest(cursor, spread)
        call_command("gator_partitions", "--convert", "--granularity", partitioning, verbosity=0)
        call_command("gator_partitions", "--drop-backup", verbosity=0)
    print(f"{storage}: loading {args.rows:,} rows", flush=True)
    with connection.cursor() as cursor:
        load_s = fill.fill(cursor, args.rows, spread, args.backlog)
        fill.fill_tallies(cursor, spread)
        started = time.monotonic()
        cursor.execute("VACUUM ANALYZE django_gator_job")
        cursor.execute("VACUUM ANALYZE django_gator_finished_tally")
        vacuum_s = time.monotonic() - started
        cursor.execute("SELECT min(id), max(id), count(*) FROM django_gator_job")
        context["oldest"], context["newest"], count = cursor.fetchone()
        cursor.execute(
            f"SELECT sum(pg_total_relation_size(relid)) FROM ({LEAVES}) AS t",
            ["django_gator_job", "django_gator_job"],
        )
        size = cursor.fetchone()[0]
    print(
        f"{storage}: {count:,} rows, {size / 2**30:.2f} GiB, loaded in {load_s:.0f} s", flush=True
    )
    results = time_pages(context, args.repeat)
    return {
        "storage": storage,
        "partitioning": partitioning or None,
        "rows": count,
        "unfinished": dict(fill.active_rows(args.backlog)),
        "size_gib": round(size / 2**30, 2),
        "load_s": round(load_s, 1),
        "vacuum_analyze_s": round(vacuum_s, 1),
        "pages": results,
    }


def time_pages(context: dict[str, Any], repeat: int) -> dict[str, Any]:
    from django.test import Client

    client = Client()
    client.force_login(context["user"])
    results: dict[str, Any] = {}
    for label, url in pages(context):
        result = timed(lambda url=url: client.get(url).status_code, repeat)
        result.update(url=url, target_ms=ADMIN_TARGET_MS)
        results[label] = result
        print(f"  {label:<32} median {result['median_ms']:>8} ms  max {result['max_ms']:>8} ms  "
              f"cold {result['cold_ms']:>8} ms  SQL {result['sql_median_ms']:>8} ms in "
              f"{result['statements']} statements  {result['statuses']}", flush=True)  # fmt: skip
    server, port = serve_metrics()
    try:
        result = timed(lambda: scrape(port), repeat)
    finally:
        server.shutdown()
    # Served from another thread: its statements are not this thread's connection's.
    result.update(url="/metrics (HTTP)", target_ms=SCRAPE_TARGET_MS, sql_median_ms=None)
    results["/metrics scrape"] = result
    print(f"  {'/metrics scrape':<32} median {result['median_ms']:>8} ms  max "
          f"{result['max_ms']:>8} ms  cold {result['cold_ms']:>8} ms", flush=True)  # fmt: skip
    return results


def check_space(directory: Path, rows: int) -> None:
    free = shutil.disk_usage(directory).free
    need = rows * BYTES_PER_ROW
    print(f"disk: {free / 2**30:.1f} GiB free in {directory}, ~{need / 2**30:.1f} GiB needed")
    if need > 0.8 * free:
        raise SystemExit(
            f"--rows {rows:,} needs about {need / 2**30:.1f} GiB in {directory}, which has "
            f"{free / 2**30:.1f} GiB free: fewer rows, or another --cluster"
        )


def table(report: dict[str, Any]) -> str:
    runs = report["runs"]
    head = "| page | " + " | ".join(f"{r['storage']}: median / max (SQL) ms" for r in runs) + " |"
    lines = [head, "|---" * (len(runs) + 1) + "|"]
    for label in runs[0]["pages"]:
        cells = []
        for r in runs:
            p = r["pages"][label]
            miss = " **over**" if p["max_ms"] > p["target_ms"] else ""
            sql = "-" if p.get("sql_median_ms") is None else f"{p['sql_median_ms']:,.0f}"
            cells.append(f"{p['median_ms']:,.0f} / {p['max_ms']:,.0f} ({sql}){miss}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.admin_volume", description=__doc__)
    p.add_argument("--rows", type=int, default=20_000_000)
    p.add_argument("--repeat", type=int, default=5, help="timed requests per page")
    p.add_argument(
        "--backlog", type=int, default=0, help="due jobs beyond the soak's (after an outage)"
    )
    p.add_argument("--storage", default="plain,partitioned", help="plain, partitioned or both")
    p.add_argument("--partitioning", choices=["day", "hour"], default="hour")
    p.add_argument("--cluster", choices=["throwaway", "shared"], default="throwaway")
    p.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/gator_soak_volume")
    p.add_argument("--port", type=int, default=5532, help="port of the throwaway cluster")
    p.add_argument("--pg-bindir", default="/usr/lib/postgresql/15/bin")
    p.add_argument("--shared-buffers", default="1GB", help="of the throwaway cluster")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/admin-volume.json")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    end_on_sigterm()
    storages = [s.strip() for s in args.storage.split(",") if s.strip()]
    bad = [s for s in storages if s not in ("plain", "partitioned")]
    if bad or not storages:
        raise SystemExit(f"--storage: plain and/or partitioned, got {args.storage!r}")
    cluster = None
    if args.cluster == "throwaway":
        check_space(Path(tempfile.gettempdir()), args.rows)
        settings = {"shared_buffers": f"'{args.shared_buffers}'", "max_wal_size": "'8GB'"}
        cluster = ThrowawayCluster(args.port, args.pg_bindir, settings)
        url = cluster.start("gator_soak_volume")
    else:
        url = args.database_url
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.admin_volume.settings"
    os.environ["GATOR_SOAK_ROLE"] = "admin-volume"
    import django

    django.setup()
    from django.db import connection

    try:
        runs = [measure_storage(url, storage, args) for storage in storages]
        with connection.cursor() as cursor:
            server = server_facts(cursor)
    finally:
        connection.close()
        if cluster is not None:
            cluster.stop()
    report = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "server": server,
        "targets_ms": {"admin": ADMIN_TARGET_MS, "scrape": SCRAPE_TARGET_MS},
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(table(report))
    print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
