"""How each database builds the index of the fair claim (migration 0027): see
``django_gator.indexes.fair_index``.

PostgreSQL and SQLite get the declared partial index (on partitioned storage PostgreSQL
builds it on the parent, so every partition has it; the conversion puts it on the active
partition, as its condition names only ready states). MySQL and MariaDB have no partial
indexes: a virtual column ``fair_rank`` (``-priority`` while the job is ready, has a stamp
and no concurrency key, NULL otherwise) leads a plain index that the claim walks in order.
"""

from __future__ import annotations

from typing import Any

from django_gator.indexes import READY_STATES_SQL, fair_index

MYSQL_FAIR_FORWARD = [
    "ALTER TABLE django_gator_job ADD COLUMN fair_rank smallint GENERATED ALWAYS AS "
    f"(CASE WHEN state IN {READY_STATES_SQL} AND concurrency_key IS NULL "
    "AND fair_order IS NOT NULL THEN -priority ELSE NULL END) VIRTUAL",
    "CREATE INDEX gator_job_fair_my ON django_gator_job (queue, fair_rank, fair_order, id)",
]
MYSQL_FAIR_BACKWARD = [
    "DROP INDEX gator_job_fair_my ON django_gator_job",
    "ALTER TABLE django_gator_job DROP COLUMN fair_rank",
]


def create_fair(apps: Any, schema_editor: Any) -> None:
    _step(apps, schema_editor, forward=True)


def drop_fair(apps: Any, schema_editor: Any) -> None:
    _step(apps, schema_editor, forward=False)


def _step(apps: Any, schema_editor: Any, *, forward: bool) -> None:
    """Migration 0027's index, built (``forward``) or dropped, as suits the database."""
    if schema_editor.connection.vendor == "mysql":
        for sql in MYSQL_FAIR_FORWARD if forward else MYSQL_FAIR_BACKWARD:
            schema_editor.execute(sql)
    elif forward:
        restore_fair_index(apps.get_model("django_gator", "Job"), schema_editor)
    else:
        schema_editor.remove_index(apps.get_model("django_gator", "Job"), fair_index())


def restore_fair_index(job: Any, schema_editor: Any) -> None:
    """Create the fair claim's index where it is missing (PostgreSQL and SQLite; a SQLite
    table rebuild drops it)."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        existing = connection.introspection.get_constraints(cursor, job._meta.db_table)
    if fair_index().name not in existing:
        schema_editor.add_index(job, fair_index())
