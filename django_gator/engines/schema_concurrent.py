"""Partial indexes that PostgreSQL builds without blocking the jobs table's writers
(``CREATE INDEX CONCURRENTLY``; migrations 0018 and 0029), SQLite builds where they
are missing, and MySQL and MariaDB do without; and the lookups of what the table has."""

from __future__ import annotations

from typing import Any

from django.db import models

from django_gator.indexes import open_steps_index


def existing(job: Any, schema_editor: Any) -> dict[str, Any]:
    """The constraints and indexes the jobs table has now, by name."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        return dict(connection.introspection.get_constraints(cursor, job._meta.db_table))


def add_missing(job: Any, schema_editor: Any, index: models.Index) -> None:
    if index.name not in existing(job, schema_editor):
        schema_editor.add_index(job, index)


def create_partial(
    apps: Any, schema_editor: Any, index: models.Index, leaves: tuple[str, ...] = ("active",)
) -> None:
    """A partial index of a migration that MySQL and MariaDB do without: SQLite builds it
    where it is missing, PostgreSQL without blocking writers (build_concurrently)."""
    connection = schema_editor.connection
    if connection.vendor == "mysql":
        return
    job = apps.get_model("django_gator", "Job")
    if connection.vendor != "postgresql":
        add_missing(job, schema_editor, index)
    else:
        build_concurrently(job, schema_editor, index, leaves)


def build_concurrently(
    job: Any, schema_editor: Any, index: models.Index, leaves: tuple[str, ...]
) -> None:
    """PostgreSQL: ``CREATE INDEX CONCURRENTLY``, so the table's writers are not blocked
    while it reads the table (the migration is not atomic, as CONCURRENTLY requires). A
    build that failed half-way leaves an invalid index of that name: it is dropped and
    built again. On partitioned storage, whose parent cannot be indexed concurrently, the
    index goes on the list partitions ``leaves`` (those holding the states its condition
    names), named as the conversion names such indexes (engines/partition_indexes.py): the
    first one's as the plain table's, the others' with their partition's suffix."""
    connection = schema_editor.connection
    qn = connection.ops.quote_name
    table = job._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [table])
        partitioned = cursor.fetchone()[0] == "p"
    targets = [(index.name, table)]
    if partitioned:
        targets = [
            (index.name if n == 0 else f"{index.name}_{leaf}", f"{table}_{leaf}")
            for n, leaf in enumerate(leaves)
        ]
    sql = str(index.create_sql(job, schema_editor, concurrently=True))
    for name, target in targets:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(%s)",
                [name],
            )
            row = cursor.fetchone()
        if row is not None and row[0]:
            continue
        if row is not None:
            schema_editor.execute(f"DROP INDEX CONCURRENTLY {qn(name)}")
        aimed = sql.replace(f" {qn(index.name)} ON {qn(table)} ", f" {qn(name)} ON {qn(target)} ")
        schema_editor.execute(aimed)


def drop_partial(
    apps: Any, schema_editor: Any, index: models.Index, leaves: tuple[str, ...] = ("active",)
) -> None:
    connection = schema_editor.connection
    if connection.vendor == "mysql":
        return
    if connection.vendor == "postgresql":  # the names build_concurrently gives
        for name in [index.name] + [f"{index.name}_{leaf}" for leaf in leaves[1:]]:
            schema_editor.execute(
                f"DROP INDEX CONCURRENTLY IF EXISTS {connection.ops.quote_name(name)}"
            )
        return
    schema_editor.remove_index(apps.get_model("django_gator", "Job"), index)


# -- the workflow gauges (migration 0029) ----------------------------------------------------


def create_open_steps_index(apps: Any, schema_editor: Any) -> None:
    """PostgreSQL ``CREATE INDEX CONCURRENTLY`` (writers not blocked), SQLite a plain
    build; MySQL and MariaDB nothing."""
    create_partial(apps, schema_editor, open_steps_index())


def drop_open_steps_index(apps: Any, schema_editor: Any) -> None:
    drop_partial(apps, schema_editor, open_steps_index())


def restore_open_steps_index(job: Any, schema_editor: Any) -> None:
    """Create 0029's index where it is missing (on SQLite, a later migration that rebuilds
    the table must call this)."""
    add_missing(job, schema_editor, open_steps_index())
