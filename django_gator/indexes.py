"""The indexes the claim and the rescue depend on, per database.

PostgreSQL and SQLite get partial indexes that hold only the rows they serve, so finished
jobs piling up never slow a claim. MySQL and MariaDB have no partial indexes: there a virtual
column ``ready_rank`` (``-priority`` while the job is waiting or failed, NULL otherwise)
leads an index that the claim walks in order, stopping after the rows it takes; without it
InnoDB would lock every row it scanned and SKIP LOCKED would starve the other workers.

These live in a migration rather than in ``Job.Meta.indexes`` so that no database is asked
for an index it cannot build (Django warns with models.W037 on MariaDB otherwise).
"""

from __future__ import annotations

from typing import Any

from django.db import models

READY_STATES_SQL = "('waiting', 'failed')"


def partial_indexes() -> list[models.Index]:
    return [
        # WHERE state IN ready AND queue = %s AND next_execution_at <= now
        # ORDER BY priority DESC, next_execution_at, id
        models.Index(
            fields=["queue", "-priority", "next_execution_at", "id"],
            name="gator_job_ready",
            condition=models.Q(state__in=["waiting", "failed"]),
        ),
        # Rescue and shutdown: the running jobs, by worker.
        models.Index(
            fields=["reserved_by"],
            name="gator_job_running",
            condition=models.Q(state="running"),
        ),
    ]


MYSQL_FORWARD = [
    "ALTER TABLE django_gator_job ADD COLUMN ready_rank smallint GENERATED ALWAYS AS "
    f"(CASE WHEN state IN {READY_STATES_SQL} THEN -priority ELSE NULL END) VIRTUAL",
    "CREATE INDEX gator_job_ready_my ON django_gator_job "
    "(queue, ready_rank, next_execution_at, id)",
    "CREATE INDEX gator_job_running_my ON django_gator_job (state, reserved_by)",
]
MYSQL_BACKWARD = [
    "DROP INDEX gator_job_running_my ON django_gator_job",
    "DROP INDEX gator_job_ready_my ON django_gator_job",
    "ALTER TABLE django_gator_job DROP COLUMN ready_rank",
]


def create(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "mysql":
        for sql in MYSQL_FORWARD:
            schema_editor.execute(sql)
        return
    job = apps.get_model("django_gator", "Job")
    for index in partial_indexes():
        schema_editor.add_index(job, index)


def drop(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "mysql":
        for sql in MYSQL_BACKWARD:
            schema_editor.execute(sql)
        return
    job = apps.get_model("django_gator", "Job")
    for index in partial_indexes():
        schema_editor.remove_index(job, index)
