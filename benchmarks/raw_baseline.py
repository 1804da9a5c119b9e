"""``python -m benchmarks.raw_baseline``: what the driver and PostgreSQL allow on this
machine, next to django-gator doing the same work, in one run (A/B, alternated).

Three pairs, each on the jobs table of the database at ``--database-url`` (its name must
contain ``pickup`` or ``raw``: the benchmark deletes every job in it):

- *bulk*: ``--rows`` jobs (default 100,000) with small arguments (``[i, "item-i"]``). Raw:
  psycopg ``COPY ... FROM STDIN`` with ``write_row`` of each row (its arguments through
  ``json.dumps``), one transaction. django-gator: ``dispatch_many()`` of the same argument
  lists (validation, JSON, the returned Job objects, COPY, NOTIFY).
- *single*: ``--single`` jobs one at a time. Raw: ``INSERT ... RETURNING id`` and a commit
  per job, parameters bound by the driver. django-gator: ``dispatch()`` in autocommit (its
  INSERT also NOTIFYs).
- *drain*: ``--drain`` due no-op jobs, taken and marked done. Raw: one connection, no
  threads, no Django, ``synchronous_commit = off``: the claim statement's shape
  (``WITH picked AS (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 100) UPDATE ... RETURNING``)
  then the success mark's (``UPDATE ... FROM unnest(...)`` with the compare-and-set), each
  committed, ``--batch`` (100) at a time. django-gator: one burst ``gator_worker`` in this
  process with ``--concurrency`` threads running the no-op job (``gator_bench``'s drain).

Each figure is printed with its ratio to the raw one of the same round.
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
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
TABLE = "django_gator_job"
COLUMNS = (
    "id, name, args, kwargs, queue, priority, state, attempts, reserved_by, "
    "next_execution_at, chain_id, chain_position, chain, suspect, isolated, crashes, rescues"
)


RETURNED = ", ".join("j." + c.strip() for c in COLUMNS.split(","))


def arguments(count: int) -> list[list[Any]]:
    return [[i, f"item-{i}"] for i in range(count)]


# -- raw psycopg ------------------------------------------------------------------------------
def raw_copy(dsn: str, items: list[list[Any]]) -> float:
    import psycopg

    with psycopg.connect(dsn) as connection:
        started = time.perf_counter()
        now = connection.execute("SELECT statement_timestamp()").fetchone()[0]
        with (
            connection.cursor() as cursor,
            cursor.copy(
                f"COPY {TABLE} (name, args, kwargs, queue, priority, next_execution_at, "
                "created_at) FROM STDIN"
            ) as copy,
        ):
            dumps = json.dumps
            for args in items:
                copy.write_row(("raw.noop", dumps(args), "{}", "raw", 0, now, now))
        connection.commit()
        return len(items) / (time.perf_counter() - started)


def raw_single(dsn: str, count: int) -> float:
    import psycopg

    sql = (
        f"INSERT INTO {TABLE} (name, args, kwargs, queue, priority, next_execution_at, "
        "created_at, state, attempts, rescues, last_error) VALUES (%s, %s::jsonb, %s::jsonb, "
        "%s, %s, statement_timestamp(), statement_timestamp(), 'waiting', 0, 0, '') "
        "RETURNING id"
    )
    with psycopg.connect(dsn) as connection:
        started = time.perf_counter()
        for i in range(count):
            connection.execute(sql, ["raw.noop", json.dumps([i]), "{}", "raw", 0]).fetchone()
            connection.commit()
        return count / (time.perf_counter() - started)


def raw_drain(dsn: str, count: int, batch: int) -> float:
    """Claim ``batch`` due jobs and mark them succeeded, until none is left."""
    import psycopg

    claim = (
        f"WITH picked AS (SELECT id FROM {TABLE} WHERE queue = %s AND state IN "
        "('waiting', 'failed') AND next_execution_at <= statement_timestamp() "
        "ORDER BY priority DESC, next_execution_at, id LIMIT %s FOR UPDATE SKIP LOCKED) "
        f"UPDATE {TABLE} AS j SET state = 'running', attempts = j.attempts + 1, "
        "reserved_by = %s, locked_at = statement_timestamp(), isolated = FALSE, "
        "started_at = COALESCE(j.started_at, statement_timestamp()) FROM picked "
        f"WHERE j.id = picked.id RETURNING {RETURNED}"
    )
    mark = (
        f"UPDATE {TABLE} AS j SET state = 'succeeded', finished_at = statement_timestamp(), "
        "result = u.r::jsonb FROM unnest(%s::bigint[], %s::int[], %s::text[]) AS u(id, "
        "attempts, r) WHERE j.id = u.id AND CASE WHEN j.attempts = u.attempts AND "
        "j.state = 'running' AND j.reserved_by = %s THEN true END RETURNING j.id"
    )
    done = 0
    with psycopg.connect(dsn) as connection:
        connection.execute("SET synchronous_commit TO off")
        connection.commit()
        started = time.perf_counter()
        while True:
            rows = connection.execute(claim, ["raw", batch, "raw-worker"]).fetchall()
            connection.commit()
            if not rows:
                break
            ids = [row[0] for row in rows]
            attempts = [row[7] for row in rows]
            marked = connection.execute(
                mark, [ids, attempts, [None] * len(ids), "raw-worker"]
            ).fetchall()
            connection.commit()
            done += len(marked)
        elapsed = time.perf_counter() - started
    if done != count:
        raise RuntimeError(f"raw drain finished {done} of {count}")
    return count / elapsed


# -- django-gator -----------------------------------------------------------------------------
def gator_bulk(items: list[list[Any]]) -> float:
    from django_gator.bench import BenchNoop

    started = time.perf_counter()
    jobs = BenchNoop.dispatch_many(items)
    elapsed = time.perf_counter() - started
    if len(jobs) != len(items) or jobs[-1].pk is None:
        raise RuntimeError("dispatch_many did not return every job")
    return len(items) / elapsed


def gator_single(count: int) -> float:
    from django_gator.bench import bench_dispatch

    return bench_dispatch(count)


def gator_drain(count: int, concurrency: int) -> float:
    from django_gator.bench import bench_drain

    return bench_drain(count, concurrency)[0]


def clean(dsn: str) -> None:
    """Every job gone, the table vacuumed: each measurement starts on a clean table."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(f"TRUNCATE {TABLE}")
        connection.execute(f"VACUUM ANALYZE {TABLE}")


def seed_raw(dsn: str, count: int) -> None:
    raw_copy(dsn, [[i] for i in range(count)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default="postgres://postgres@127.0.0.1:5432/gator_raw_baseline"
    )
    parser.add_argument("--only", choices=["bulk", "single", "drain"], action="append")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--single", type=int, default=2_000)
    parser.add_argument("--drain", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    url = args.database_url
    name = urlsplit(url).path.lstrip("/")
    if "raw" not in name and "pickup" not in name:
        raise SystemExit(f"its jobs are deleted: the database name must contain 'raw' ({name!r})")
    dsn = url.replace("postgres://", "postgresql://", 1)

    from benchmarks.pickup.__main__ import child_env

    _create(url)
    os.environ.update(child_env(url))
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v0"], cwd=ROOT, check=True)
    import django

    django.setup()
    from django.db import connection

    connection.ensure_connection()
    version = ".".join(map(str, connection.get_database_version()))
    print(
        f"raw driver against django-gator: postgresql {version}, Django {django.get_version()}, "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
    )
    only = args.only or ["bulk", "single", "drain"]
    results: dict[str, list[tuple[float, float]]] = {}

    def pair(label: str, raw: Callable[[], float], gator: Callable[[], float]) -> None:
        clean(dsn)
        r = raw()
        clean(dsn)
        g = gator()
        results.setdefault(label, []).append((r, g))
        print(f"{label:<34} raw {r:>10,.0f}/s  django-gator {g:>10,.0f}/s  ratio {g / r:.2f}")

    for _ in range(args.rounds):
        if "bulk" in only:
            items = arguments(args.rows)
            pair(
                f"bulk {args.rows:,} rows (COPY)",
                lambda items=items: raw_copy(dsn, items),
                lambda items=items: gator_bulk(items),
            )
        if "single" in only:
            pair(
                f"single insert + commit x{args.single:,}",
                lambda: raw_single(dsn, args.single),
                lambda: gator_single(args.single),
            )
        if "drain" in only:

            def raw() -> float:
                seed_raw(dsn, args.drain)
                return raw_drain(dsn, args.drain, args.batch)

            pair(
                f"drain {args.drain:,} (raw batch {args.batch}, {args.concurrency} threads)",
                raw,
                lambda: gator_drain(args.drain, args.concurrency),
            )
    summary = {
        label: {
            "raw_per_s": [r for r, _ in pairs],
            "gator_per_s": [g for _, g in pairs],
            "ratio_median": statistics.median(g / r for r, g in pairs),
        }
        for label, pairs in results.items()
    }
    for label, entry in summary.items():
        print(f"{label:<34} median ratio {entry['ratio_median']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


def _create(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    maintenance = parts._replace(path="/postgres").geturl()
    with psycopg.connect(maintenance, autocommit=True) as connection:
        if not connection.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [name]
        ).fetchone():
            connection.execute(f'CREATE DATABASE "{name}"')


if __name__ == "__main__":
    main()
