"""How each database builds the indexes of windows and expiry (migration 0023): see
``django_gator.indexes.dedupe_waiting_constraint`` and ``dedupe_indexes``.

PostgreSQL and SQLite get the declared partial indexes. MySQL and MariaDB have none: a
virtual column that holds the dedupe key only while the job waits carries the unique index
(NULLs never collide), and one that holds ``expires_at`` only while the job is ready carries
the expiry sweep's index; the key's jobs get a plain index."""

from __future__ import annotations

from typing import Any

from django_gator.indexes import READY_STATES_SQL, dedupe_indexes, dedupe_waiting_constraint
from django_gator.states import SQL_WAITING

MYSQL_DEDUPE_FORWARD = [
    "ALTER TABLE django_gator_job ADD COLUMN dedupe_waiting varchar(200) GENERATED ALWAYS AS "
    f"(CASE WHEN state = {SQL_WAITING} THEN dedupe_key ELSE NULL END) VIRTUAL",
    "CREATE UNIQUE INDEX gator_job_dedupe_waiting_my ON django_gator_job (name, dedupe_waiting)",
    "CREATE INDEX gator_job_dedupe_my ON django_gator_job (dedupe_key, name, started_at)",
    "ALTER TABLE django_gator_job ADD COLUMN expiring_at datetime(6) GENERATED ALWAYS AS "
    f"(CASE WHEN state IN {READY_STATES_SQL} THEN expires_at ELSE NULL END) VIRTUAL",
    "CREATE INDEX gator_job_expiring_my ON django_gator_job (expiring_at)",
]
MYSQL_DEDUPE_BACKWARD = [
    "DROP INDEX gator_job_expiring_my ON django_gator_job",
    "ALTER TABLE django_gator_job DROP COLUMN expiring_at",
    "DROP INDEX gator_job_dedupe_my ON django_gator_job",
    "DROP INDEX gator_job_dedupe_waiting_my ON django_gator_job",
    "ALTER TABLE django_gator_job DROP COLUMN dedupe_waiting",
]


def create_dedupe(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "mysql":
        for sql in MYSQL_DEDUPE_FORWARD:
            schema_editor.execute(sql)
        return
    restore_dedupe_indexes(apps.get_model("django_gator", "Job"), schema_editor)


def drop_dedupe(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "mysql":
        for sql in MYSQL_DEDUPE_BACKWARD:
            schema_editor.execute(sql)
        return
    job = apps.get_model("django_gator", "Job")
    schema_editor.remove_constraint(job, dedupe_waiting_constraint())
    for index in dedupe_indexes():
        schema_editor.remove_index(job, index)


def restore_dedupe_indexes(job: Any, schema_editor: Any) -> None:
    """Create the indexes of migration 0023 that are missing (PostgreSQL and SQLite; a
    SQLite table rebuild drops them)."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        existing = connection.introspection.get_constraints(cursor, job._meta.db_table)
    constraint = dedupe_waiting_constraint()
    if constraint.name not in existing:
        schema_editor.add_constraint(job, constraint)
    for index in dedupe_indexes():
        if index.name not in existing:
            schema_editor.add_index(job, index)
