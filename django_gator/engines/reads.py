"""Reads that other layers need and that are SQL: one function each, taking the engine.

They were statements of their own in ``tasks/results.py``, ``worker/scheduler.py`` and
``stats.py``; the engines hold every statement and vendor branch, so a fourth database is
a matter of the engines alone.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django_gator import conf
from django_gator.engines.contract import JobEngine, behind


def attempt_details(job_engine: JobEngine, job_id: int) -> tuple[Any, ...] | None:
    """(created_at, started_at, locked_at, errors, reserved_by) of job ``job_id``, by its
    primary key (a running task's result, read on the worker's hot path without the ORM);
    None if there is no such row. Times as the driver returns them (``engine.to_dt``)."""
    engine = behind(job_engine)
    with engine.connection.cursor() as cursor:
        cursor.execute(
            f"SELECT created_at, started_at, locked_at, errors, reserved_by "
            f"FROM {engine.job_table} WHERE id = %s",
            [job_id],
        )
        row = cursor.fetchone()
    return None if row is None else tuple(row)


def schedules_look(
    job_engine: JobEngine, schedule_table: str, *, with_now: bool
) -> tuple[datetime | None, datetime | None]:
    """(the database's now if ``with_now``, else None; the earliest ``next_run_at`` of an
    enabled schedule or None), in one statement: what an idle worker's scheduler costs the
    database per look."""
    engine = behind(job_engine)
    table = engine.connection.ops.quote_name(schedule_table)
    earliest_sql = (
        f"(SELECT MIN(next_run_at) FROM {table} WHERE enabled = %s AND next_run_at IS NOT NULL)"
    )
    with engine.connection.cursor() as cursor:
        if with_now:
            cursor.execute(f"SELECT {engine.now_sql}, {earliest_sql}", [True])
            db_now, earliest = cursor.fetchone()
        else:
            cursor.execute(f"SELECT {earliest_sql}", [True])
            (earliest,) = cursor.fetchone()
            db_now = None
    return (
        None if db_now is None else engine.to_dt(db_now),
        None if earliest is None else engine.to_dt(earliest),
    )


def row_estimate(job_engine: JobEngine, table: str) -> int | None:
    """The database's own estimate of ``table``'s row count, or None where it has none
    (SQLite) or has not made one yet (a PostgreSQL table never vacuumed nor analyzed).

    PostgreSQL: ``pg_class.reltuples``, kept by VACUUM and ANALYZE. MySQL/MariaDB:
    ``information_schema.TABLES.TABLE_ROWS``, InnoDB's estimate (it can be off by tens of
    percent, and MySQL 8 caches it for ``information_schema_stats_expiry`` seconds)."""
    connection = behind(job_engine).connection
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # Partitioned storage: the parent has no estimate of its own; its partitions'.
            sql = "SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)"
            params = [connection.ops.quote_name(table)]
            if conf.partitioning() is not None:
                sql = (
                    "SELECT COALESCE((SELECT sum(GREATEST(c.reltuples, 0)) FROM"
                    " pg_partition_tree(to_regclass(%s)) t JOIN pg_class c ON c.oid = t.relid"
                    f" WHERE t.isleaf), ({sql}))"
                )
                params *= 2
            cursor.execute(sql, params)
            row = cursor.fetchone()
            # -1 (PostgreSQL 14+) or 0 with no pages: never vacuumed nor analyzed.
            return int(row[0]) if row is not None and row[0] is not None and row[0] > 0 else None
        if connection.vendor == "mysql":
            cursor.execute(
                "SELECT TABLE_ROWS FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
                [table],
            )
            row = cursor.fetchone()
            return int(row[0]) if row is not None and row[0] is not None else None
    return None
