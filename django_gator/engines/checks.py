"""The database's own system checks (W001, W002, E004): what each database needs of its
server or its settings for the engines to work as they should. ``django_gator.checks``
runs them, after its checks of the tables, for the database it was asked about."""

from __future__ import annotations

from typing import Any

from django.core import checks

from django_gator import conf
from django_gator.models import Job


def server_checks(alias: str, connection: Any) -> list[checks.CheckMessage]:
    """What is wrong with database ``alias`` (``connection``, Django's) for django-gator."""
    if connection.vendor == "sqlite":
        return check_sqlite(alias, connection)
    if connection.vendor == "mysql":
        return check_mysql(alias, connection) + check_partitioning(alias, connection)
    return check_partitioning(alias, connection)


def check_partitioning(alias: str, connection: Any) -> list[checks.CheckMessage]:
    """W008: GATOR_PARTITIONING and the jobs table disagree (set on a database other than
    PostgreSQL; set while the table is plain; unset while it is partitioned)."""
    granularity = conf.get("GATOR_PARTITIONING")
    if connection.vendor != "postgresql":
        if granularity is None:
            return []
        return [
            checks.Warning(
                f"GATOR_PARTITIONING is {granularity!r}, but database {alias!r} is "
                f"{connection.vendor}: partitioned storage is PostgreSQL's only.",
                hint="Remove the setting: this database keeps DELETE pruning (gator_prune).",
                id="django_gator.W008",
            )
        ]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [Job._meta.db_table]
        )
        row = cursor.fetchone()
    if row is None:
        return []  # not migrated yet: W003
    partitioned = row[0] == "p"
    if granularity is not None and not partitioned:
        return [
            checks.Warning(
                f"GATOR_PARTITIONING is {granularity!r}, but the jobs table on {alias!r} is a "
                "plain table.",
                hint="Convert it (online): manage.py gator_partitions --convert. Until then "
                "finished jobs are pruned by DELETE.",
                id="django_gator.W008",
            )
        ]
    if granularity is None and partitioned:
        return [
            checks.Warning(
                f"The jobs table on {alias!r} is partitioned, but GATOR_PARTITIONING is None: "
                "no worker creates its time partitions, and finished jobs will pile up in "
                "its default partition.",
                hint="Set GATOR_PARTITIONING to 'day' or 'hour', or go back to a plain table: "
                "manage.py gator_partitions --revert.",
                id="django_gator.W008",
            )
        ]
    return []


def check_sqlite(alias: str, connection: Any) -> list[checks.CheckMessage]:
    """SQLite: WAL journal mode (W001) and IMMEDIATE transactions (W002)."""
    messages: list[checks.CheckMessage] = []
    # An in-memory database lives in one process, so nothing can block on it, and it cannot
    # be in WAL mode. That includes the test runner's database for a file database without
    # TEST NAME ("file:memorydb_default?mode=memory&cache=shared"), which the check sees in
    # every `manage.py test` run.
    if connection.is_in_memory_db():
        return messages
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        mode = cursor.fetchone()[0]
    if str(mode).lower() != "wal":
        messages.append(
            checks.Warning(
                f"SQLite database {alias!r} is in {mode!r} journal mode, not WAL.",
                hint=(
                    'Add "init_command": "PRAGMA journal_mode=WAL;" to its OPTIONS, so '
                    "workers and web requests do not block each other."
                ),
                id="django_gator.W001",
            )
        )
    transaction_mode = connection.settings_dict.get("OPTIONS", {}).get("transaction_mode")
    if str(transaction_mode or "").upper() != "IMMEDIATE":
        current = "no transaction_mode" if transaction_mode is None else repr(transaction_mode)
        messages.append(
            checks.Warning(
                f"SQLite database {alias!r} does not use IMMEDIATE transactions "
                f"(OPTIONS has {current}).",
                hint=(
                    'Add "transaction_mode": "IMMEDIATE" to its OPTIONS; otherwise an atomic() '
                    'block that dispatches a job can fail with "database is locked" while a '
                    "worker writes."
                ),
                id="django_gator.W002",
            )
        )
    return messages


def check_mysql(alias: str, connection: Any) -> list[checks.CheckMessage]:
    """MariaDB 10.6 or MySQL 8.0.1 at least: the first with SKIP LOCKED (E004)."""
    connection.ensure_connection()
    minimum: tuple[int, ...]
    if connection.mysql_is_mariadb:
        minimum, product = (10, 6), "MariaDB"
    else:
        minimum, product = (8, 0, 1), "MySQL"
    version = connection.mysql_version
    if version < minimum:
        return [
            checks.Error(
                f"{product} {'.'.join(map(str, version))} on {alias!r} has no SKIP LOCKED.",
                hint=f"django-gator needs {product} {'.'.join(map(str, minimum))} or newer.",
                id="django_gator.E004",
            )
        ]
    return []
