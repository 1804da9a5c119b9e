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

from django_gator import states
from django_gator.states import READY_STATES, JobState, sql_list

READY_STATES_SQL = sql_list(READY_STATES)
#: States in which a unique job blocks a second dispatch with the same key.
ACTIVE_STATES = [state.value for state in states.ACTIVE_STATES]


def partial_indexes(*, flow: bool = False) -> list[models.Index]:
    """The claim's and the rescue's indexes. ``flow``: as migration 0009 left them, where
    the ready index holds only the jobs without a concurrency key (the others are in
    flow_indexes())."""
    ready = models.Q(state__in=[state.value for state in READY_STATES])
    return [
        # WHERE state IN ready AND queue = %s AND next_execution_at <= now
        # ORDER BY priority DESC, next_execution_at, id
        models.Index(
            fields=["queue", "-priority", "next_execution_at", "id"],
            name="gator_job_ready",
            condition=ready & models.Q(concurrency_key__isnull=True) if flow else ready,
        ),
        # Rescue and shutdown: the running jobs, by worker.
        models.Index(
            fields=["reserved_by"],
            name="gator_job_running",
            condition=models.Q(state=JobState.RUNNING.value),
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


# -- flow control (migration 0009) ---------------------------------------------------------


def flow_indexes() -> list[models.Index]:
    """The indexes of the limited claim: the ready jobs of limited classes (kept out of
    ``gator_job_ready``, so the ordinary claim never steps over them), and the running jobs
    it counts, per key and per queue."""
    ready = models.Q(state__in=[state.value for state in READY_STATES])
    running = models.Q(state=JobState.RUNNING.value)
    return [
        models.Index(
            fields=["queue", "-priority", "next_execution_at", "id"],
            name="gator_job_ready_keyed",
            condition=ready & models.Q(concurrency_key__isnull=False),
        ),
        models.Index(
            fields=["name", "concurrency_key"],
            name="gator_job_running_keyed",
            condition=running & models.Q(concurrency_key__isnull=False),
        ),
        models.Index(fields=["queue"], name="gator_job_running_queue", condition=running),
    ]


_READY_RANK = "smallint GENERATED ALWAYS AS (CASE WHEN state IN {} AND concurrency_key IS {} "
_READY_RANK += "THEN -priority ELSE NULL END) VIRTUAL"
MYSQL_FLOW_FORWARD = [
    "DROP INDEX gator_job_ready_my ON django_gator_job",
    "ALTER TABLE django_gator_job DROP COLUMN ready_rank",
    "ALTER TABLE django_gator_job ADD COLUMN ready_rank "
    + _READY_RANK.format(READY_STATES_SQL, "NULL"),
    "CREATE INDEX gator_job_ready_my ON django_gator_job "
    "(queue, ready_rank, next_execution_at, id)",
    "ALTER TABLE django_gator_job ADD COLUMN flow_rank "
    + _READY_RANK.format(READY_STATES_SQL, "NOT NULL"),
    "CREATE INDEX gator_job_flow_my ON django_gator_job (queue, flow_rank, next_execution_at, id)",
    "ALTER TABLE django_gator_job ADD COLUMN running_key varchar(200) GENERATED ALWAYS AS "
    f"(CASE WHEN state = '{JobState.RUNNING.value}' THEN concurrency_key ELSE NULL END) VIRTUAL",
    "CREATE INDEX gator_job_running_key_my ON django_gator_job (running_key, name)",
    "CREATE INDEX gator_job_running_queue_my ON django_gator_job (state, queue)",
]
MYSQL_FLOW_BACKWARD = [
    "DROP INDEX gator_job_running_queue_my ON django_gator_job",
    "DROP INDEX gator_job_running_key_my ON django_gator_job",
    "ALTER TABLE django_gator_job DROP COLUMN running_key",
    "DROP INDEX gator_job_flow_my ON django_gator_job",
    "ALTER TABLE django_gator_job DROP COLUMN flow_rank",
    "DROP INDEX gator_job_ready_my ON django_gator_job",
    "ALTER TABLE django_gator_job DROP COLUMN ready_rank",
    "ALTER TABLE django_gator_job ADD COLUMN ready_rank smallint GENERATED ALWAYS AS "
    f"(CASE WHEN state IN {READY_STATES_SQL} THEN -priority ELSE NULL END) VIRTUAL",
    "CREATE INDEX gator_job_ready_my ON django_gator_job "
    "(queue, ready_rank, next_execution_at, id)",
]


def create_flow(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "mysql":
        for sql in MYSQL_FLOW_FORWARD:
            schema_editor.execute(sql)
        return
    job = apps.get_model("django_gator", "Job")
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        existing = connection.introspection.get_constraints(cursor, job._meta.db_table)
    [old_ready, *_] = partial_indexes()
    if old_ready.name in existing:
        schema_editor.remove_index(job, old_ready)
    [new_ready, *_] = partial_indexes(flow=True)
    schema_editor.add_index(job, new_ready)
    for index in flow_indexes():
        if index.name not in existing:
            schema_editor.add_index(job, index)
    # Whatever else a rebuild of the table (SQLite) may have dropped.
    restore_claim_indexes(job, schema_editor, unique=True)
    restore_groups_index(job, schema_editor)


def drop_flow(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "mysql":
        for sql in MYSQL_FLOW_BACKWARD:
            schema_editor.execute(sql)
        return
    job = apps.get_model("django_gator", "Job")
    for index in flow_indexes():
        schema_editor.remove_index(job, index)
    [new_ready, *_] = partial_indexes(flow=True)
    schema_editor.remove_index(job, new_ready)
    [old_ready, *_] = partial_indexes()
    schema_editor.add_index(job, old_ready)


def _has_flow(job: Any) -> bool:
    """Whether the (historical) Job model has migration 0009's concurrency_key."""
    return any(field.name == "concurrency_key" for field in job._meta.fields)


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


# -- unique jobs (migration 0003) ---------------------------------------------------------


def unique_constraint() -> models.UniqueConstraint:
    # At most one active row per (job name, unique key); finished rows never collide.
    return models.UniqueConstraint(
        fields=["name", "unique_key"],
        condition=models.Q(unique_key__isnull=False, state__in=ACTIVE_STATES),
        name="gator_job_unique",
    )


# MySQL and MariaDB: a virtual column that holds the key only while the job is active, under
# a unique index (NULLs never collide).
MYSQL_UNIQUE_FORWARD = [
    "ALTER TABLE django_gator_job ADD COLUMN unique_active varchar(200) GENERATED ALWAYS AS "
    f"(CASE WHEN {states.ACTIVE_SQL} THEN unique_key ELSE NULL END) "
    "VIRTUAL",
    "CREATE UNIQUE INDEX gator_job_unique_my ON django_gator_job (name, unique_active)",
]
MYSQL_UNIQUE_BACKWARD = [
    "DROP INDEX gator_job_unique_my ON django_gator_job",
    "ALTER TABLE django_gator_job DROP COLUMN unique_active",
]


def create_unique(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "mysql":
        for sql in MYSQL_UNIQUE_FORWARD:
            schema_editor.execute(sql)
        return
    job = apps.get_model("django_gator", "Job")
    restore_claim_indexes(job, schema_editor)
    schema_editor.add_constraint(job, unique_constraint())


def restore_claim_indexes(job: Any, schema_editor: Any, *, unique: bool = False) -> None:
    """Re-create the partial indexes of migration 0002 (and, with ``unique``, the unique
    index of 0003) where they are missing.

    On SQLite, a migration that changes the table in a way ALTER TABLE cannot (such as
    adding a NOT NULL column) copies it into a new table built from the migration state, in
    which these indexes do not appear: every such migration must call this afterwards.
    """
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        existing = connection.introspection.get_constraints(cursor, job._meta.db_table)
    flow = _has_flow(job)
    for index in partial_indexes(flow=flow) + (flow_indexes() if flow else []):
        if index.name not in existing:
            schema_editor.add_index(job, index)
    if unique and unique_constraint().name not in existing:
        schema_editor.add_constraint(job, unique_constraint())


# -- the dead-job screen (migration 0005) --------------------------------------------------


def groups_index() -> models.Index:
    # Dead and failed jobs by name and error class. Partial, so that the claims and success
    # marks of a busy queue (which change `state` on every row) never touch it. MySQL and
    # MariaDB get none: their dead-job screen reads the dead rows through the
    # (state, finished_at) index instead.
    return models.Index(
        fields=["state", "name", "error_class"],
        name="gator_job_groups",
        condition=models.Q(state__in=[JobState.DEAD.value, JobState.FAILED.value]),
    )


def create_groups_index(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "mysql":
        return
    job = apps.get_model("django_gator", "Job")
    restore_claim_indexes(job, schema_editor, unique=True)
    schema_editor.add_index(job, groups_index())


def restore_groups_index(job: Any, schema_editor: Any) -> None:
    """Re-create the dead-job screen's index of migration 0005 where it is missing (see
    restore_claim_indexes: SQLite table rebuilds drop it)."""
    _add_if_missing(job, schema_editor, groups_index())


def _add_if_missing(job: Any, schema_editor: Any, index: models.Index) -> None:
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        existing = connection.introspection.get_constraints(cursor, job._meta.db_table)
    if index.name not in existing:
        schema_editor.add_index(job, index)


def restore_after_rebuild(apps: Any, schema_editor: Any) -> None:
    """RunPython of a migration that SQLite carries out by rebuilding the jobs table (adding
    a NOT NULL column): re-create the indexes of 0002, 0003 and 0005 (and 0017) the copy
    lacks."""
    if schema_editor.connection.vendor == "sqlite":
        job = apps.get_model("django_gator", "Job")
        restore_claim_indexes(job, schema_editor, unique=True)
        restore_groups_index(job, schema_editor)
        if not any(index.name == FULL_BATCH_INDEX for index in job._meta.indexes) and any(
            field.name == "batch_id" for field in job._meta.fields
        ):
            _add_missing(job, schema_editor, batch_index())


def drop_groups_index(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "mysql":
        return
    schema_editor.remove_index(apps.get_model("django_gator", "Job"), groups_index())


# -- the queue figures' dead counts (migration 0018) ------------------------------------------


def dead_queue_index() -> models.Index:
    # The dead jobs by queue: the Prometheus view counts them per queue from this index
    # alone (PostgreSQL: an index-only scan), instead of visiting every dead row, which stay
    # until an operator prunes them. MySQL and MariaDB count them from 0013's (state, queue).
    return models.Index(
        fields=["queue"],
        name="gator_job_dead_queue",
        condition=models.Q(state=JobState.DEAD.value),
    )


def create_dead_queue_index(apps: Any, schema_editor: Any) -> None:
    """On PostgreSQL ``CREATE INDEX CONCURRENTLY``: the table's writers are not blocked
    while it reads the table (the migration is not atomic, as CONCURRENTLY requires). A
    build that failed half-way leaves an invalid index of that name: it is dropped and
    built again."""
    connection = schema_editor.connection
    if connection.vendor == "mysql":
        return
    job = apps.get_model("django_gator", "Job")
    index = dead_queue_index()
    if connection.vendor != "postgresql":
        restore_dead_queue_index(job, schema_editor)
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(%s)",
            [index.name],
        )
        row = cursor.fetchone()
    if row is not None and row[0]:
        return
    if row is not None:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY {connection.ops.quote_name(index.name)}")
    sql = str(index.create_sql(job, schema_editor, concurrently=True))
    schema_editor.execute(sql)


def restore_dead_queue_index(job: Any, schema_editor: Any) -> None:
    """Create 0018's index where it is missing (on SQLite, a later migration that rebuilds
    the table must call this, as those before it call restore_after_rebuild)."""
    _add_if_missing(job, schema_editor, dead_queue_index())


def drop_dead_queue_index(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor == "mysql":
        return
    if connection.vendor == "postgresql":
        name = connection.ops.quote_name(dead_queue_index().name)
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        return
    schema_editor.remove_index(apps.get_model("django_gator", "Job"), dead_queue_index())


def drop_unique(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "mysql":
        for sql in MYSQL_UNIQUE_BACKWARD:
            schema_editor.execute(sql)
        return
    schema_editor.remove_constraint(apps.get_model("django_gator", "Job"), unique_constraint())


# -- batch members (migration 0017) -----------------------------------------------------------

#: Migration 0012's index of every job row by (batch_id, state); MySQL and MariaDB keep it
#: (their engine names it in FORCE INDEX).
FULL_BATCH_INDEX = "gator_job_batch"


def full_batch_index() -> models.Index:
    return models.Index(fields=["batch_id", "state"], name=FULL_BATCH_INDEX)


def batch_index() -> models.Index:
    # A batch's members by state: its completion check, its workflow step's settling, its
    # admin page, the pruning of finished batches. Partial, so that the jobs outside any
    # batch (most of them) have no entry: their claims and outcome marks never write it.
    return models.Index(
        fields=["batch_id", "state"],
        name="gator_job_batch_member",
        condition=models.Q(batch_id__isnull=False),
    )


def _existing(job: Any, schema_editor: Any) -> dict[str, Any]:
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        return dict(connection.introspection.get_constraints(cursor, job._meta.db_table))


def _add_missing(job: Any, schema_editor: Any, index: models.Index) -> None:
    if index.name not in _existing(job, schema_editor):
        schema_editor.add_index(job, index)


def create_batch_index(apps: Any, schema_editor: Any) -> None:
    """PostgreSQL and SQLite: the partial index first (the queries keep an index while it
    is built), then drop the full one. Each step checks what exists, so a migration cut
    off between the two (it is not atomic) can run again."""
    if schema_editor.connection.vendor == "mysql":
        return
    job = apps.get_model("django_gator", "Job")
    _add_missing(job, schema_editor, batch_index())
    if FULL_BATCH_INDEX in _existing(job, schema_editor):
        schema_editor.remove_index(job, full_batch_index())


def drop_batch_index(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "mysql":
        return
    job = apps.get_model("django_gator", "Job")
    _add_missing(job, schema_editor, full_batch_index())
    if batch_index().name in _existing(job, schema_editor):
        schema_editor.remove_index(job, batch_index())
