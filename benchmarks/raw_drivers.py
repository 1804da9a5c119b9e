"""``python -m benchmarks.raw_drivers``: SQLite and MariaDB/MySQL's own drivers next to
django-gator doing the same work, in one run (the PostgreSQL pairs are
benchmarks/raw_baseline.py's).

The database comes from ``--database-url`` (``sqlite:///path`` or ``mysql://...``; a
MariaDB/MySQL database name must contain ``raw``: every job in it is deleted), with the
settings of benchmarks/pickup/settings.py (SQLite: WAL, ``synchronous = NORMAL``; both
sides open the file so). Pairs, each on an emptied table:

- *single*: ``--single`` jobs one at a time, each its own transaction. Raw: one
  ``INSERT ... RETURNING id`` in autocommit on a connection already open (sqlite3 with
  ``isolation_level = None``; MySQLdb with autocommit on), the arguments through
  ``json.dumps``. django-gator: ``dispatch()`` in autocommit, as a Django view does.
- *bulk*: ``--rows`` jobs with small arguments (``[i, "item-i"]``) in one transaction.
  Raw: ``executemany()`` of the same INSERT (without RETURNING; MySQLdb rewrites it into
  multi-row INSERTs), then a commit. django-gator: ``dispatch_many()`` (validation, JSON,
  the returned Job objects with their ids).

Each round runs raw first in odd rounds and django-gator first in even ones; each line
gives the ratio django-gator / raw of that round and the load average (1 minute).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from benchmarks.raw_baseline import arguments, gator_bulk

ROOT = Path(__file__).resolve().parents[1]
TABLE = "django_gator_job"
NAMES = (
    "name, args, kwargs, queue, priority, next_execution_at, created_at, state, attempts, "
    "rescues, last_error"
)

#: state, attempts, rescues, last_error: a new job's.
FIXED = ("waiting", 0, 0, "")


def connect(url: str) -> Any:
    """A raw connection in autocommit, set up as django-gator's is."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        import sqlite3

        connection = sqlite3.connect(parts.path, isolation_level=None, timeout=20)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        return connection
    import MySQLdb

    connection = MySQLdb.connect(
        host=parts.hostname,
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
        database=parts.path.lstrip("/"),
        charset="utf8mb4",
    )
    connection.autocommit(True)
    return connection


def _insert(url: str, returning: bool) -> str:
    # Every value a parameter: MySQLdb's executemany() makes one multi-row INSERT only of a
    # VALUES list of placeholders.
    values = ", ".join(["?" if url.startswith("sqlite") else "%s"] * 11)
    sql = f"INSERT INTO {TABLE} ({NAMES}) VALUES ({values})"
    return sql + " RETURNING id" if returning else sql


def _now(url: str) -> Any:
    now = datetime.now(UTC)
    # Django stores SQLite's datetimes as text, MariaDB's as naive UTC.
    return now.isoformat(" ") if url.startswith("sqlite") else now.replace(tzinfo=None)


def raw_single(url: str, count: int) -> float:
    connection = connect(url)
    try:
        sql = _insert(url, returning=True)
        cursor = connection.cursor()
        started = time.perf_counter()
        for i in range(count):
            now = _now(url)
            cursor.execute(sql, ("raw.noop", json.dumps([i]), "{}", "raw", 0, now, now, *FIXED))
            cursor.fetchone()
        return count / (time.perf_counter() - started)
    finally:
        connection.close()


def raw_bulk(url: str, items: list[list[Any]]) -> float:
    connection = connect(url)
    try:
        sql = _insert(url, returning=False)
        cursor = connection.cursor()
        started = time.perf_counter()
        now = _now(url)
        dumps = json.dumps
        rows = [("raw.noop", dumps(args), "{}", "raw", 0, now, now, *FIXED) for args in items]
        cursor.execute("BEGIN")
        cursor.executemany(sql, rows)
        cursor.execute("COMMIT")
        return len(items) / (time.perf_counter() - started)
    finally:
        connection.close()


def clean(url: str) -> None:
    connection = connect(url)
    try:
        connection.cursor().execute(f"DELETE FROM {TABLE}")
        if url.startswith("sqlite"):
            connection.execute("VACUUM")
    finally:
        connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--only", choices=["single", "bulk"], action="append")
    parser.add_argument("--single", type=int, default=2_000)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    url = args.database_url
    if not url.startswith("sqlite") and "raw" not in urlsplit(url).path:
        raise SystemExit("its jobs are deleted: the database name must contain 'raw'")
    from benchmarks.pickup.__main__ import child_env

    os.environ.update(child_env(url))
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v0"], cwd=ROOT, check=True)
    import django

    django.setup()
    from django.db import connection

    from django_gator.bench import bench_dispatch

    connection.ensure_connection()
    version = ".".join(map(str, connection.get_database_version()))
    print(
        f"raw driver against django-gator: {connection.vendor} {version}, Django "
        f"{django.get_version()}, Python {platform.python_version()}, {os.cpu_count()} CPUs"
    )
    items = arguments(args.rows)

    pairs: dict[str, tuple[Callable[[], float], Callable[[], float]]] = {
        f"single x{args.single:,}": (
            lambda: raw_single(url, args.single),
            lambda: bench_dispatch(args.single),
        ),
        f"bulk {args.rows:,} rows": (lambda: raw_bulk(url, items), lambda: gator_bulk(items)),
    }
    only = args.only or ["single", "bulk"]
    ratios: dict[str, list[float]] = {}
    for rnd in range(1, args.rounds + 1):
        for label, (raw, gator) in pairs.items():
            if label.split()[0] not in only:
                continue
            load = os.getloadavg()[0]
            figures = {}
            for side in ("raw", "gator") if rnd % 2 else ("gator", "raw"):
                clean(url)
                connection.close()
                figures[side] = raw() if side == "raw" else gator()
            ratio = figures["gator"] / figures["raw"]
            ratios.setdefault(label, []).append(ratio)
            print(
                f"round {rnd} {label:<20} raw {figures['raw']:>10,.0f}/s  django-gator "
                f"{figures['gator']:>10,.0f}/s  ratio {ratio:.2f}  (load {load:.1f})",
                flush=True,
            )
    clean(url)
    for label, values in ratios.items():
        listed = ", ".join(f"{ratio:.2f}" for ratio in values)
        print(f"{label:<20} ratios {listed}; median {statistics.median(values):.2f}")


if __name__ == "__main__":
    main()
