"""How each database builds the indexes of ``django_gator.indexes``: the migrations' steps.

PostgreSQL and SQLite build the declared partial indexes through the schema editor
(those of migrations 0018 and 0029 CONCURRENTLY). MySQL and MariaDB have no partial
indexes: they get the virtual columns and plain indexes of the ``MYSQL_*`` statements
below instead, or nothing where their claim does without. SQLite rebuilds the jobs table
for some column changes, dropping what the migration state does not list: the
``restore_*`` steps put it back.
"""

from __future__ import annotations

from typing import Any

from django_gator.engines.contract import JobEngine, behind
from django_gator.engines.schema_concurrent import add_missing, create_partial, drop_partial
from django_gator.engines.schema_concurrent import existing as table_indexes
from django_gator.indexes import (
    FULL_BATCH_INDEX,
    READY_STATES_SQL,
    batch_index,
    dead_queue_index,
    flow_indexes,
    full_batch_index,
    groups_index,
    has_flow,
    partial_indexes,
    unique_constraint,
)
from django_gator.states import ACTIVE_SQL, JobState

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

# MySQL and MariaDB: a virtual column that holds the key only while the job is active, under
# a unique index (NULLs never collide).
MYSQL_UNIQUE_FORWARD = [
    "ALTER TABLE django_gator_job ADD COLUMN unique_active varchar(200) GENERATED ALWAYS AS "
    f"(CASE WHEN {ACTIVE_SQL} THEN unique_key ELSE NULL END) "
    "VIRTUAL",
    "CREATE UNIQUE INDEX gator_job_unique_my ON django_gator_job (name, unique_active)",
]
MYSQL_UNIQUE_BACKWARD = [
    "DROP INDEX gator_job_unique_my ON django_gator_job",
    "ALTER TABLE django_gator_job DROP COLUMN unique_active",
]


def _mysql(schema_editor: Any, statements: list[str] | None = None) -> bool:
    """Whether the database is MySQL or MariaDB; if so, ``statements`` have been run."""
    if schema_editor.connection.vendor != "mysql":
        return False
    for sql in statements or ():
        schema_editor.execute(sql)
    return True


# -- the claim's indexes (migration 0002) ----------------------------------------------------


def create(apps: Any, schema_editor: Any) -> None:
    if _mysql(schema_editor, MYSQL_FORWARD):
        return
    job = apps.get_model("django_gator", "Job")
    for index in partial_indexes():
        schema_editor.add_index(job, index)


def drop(apps: Any, schema_editor: Any) -> None:
    if _mysql(schema_editor, MYSQL_BACKWARD):
        return
    job = apps.get_model("django_gator", "Job")
    for index in partial_indexes():
        schema_editor.remove_index(job, index)


# -- flow control (migration 0013) -----------------------------------------------------------


def create_flow(apps: Any, schema_editor: Any) -> None:
    if _mysql(schema_editor, MYSQL_FLOW_FORWARD):
        return
    job = apps.get_model("django_gator", "Job")
    existing = table_indexes(job, schema_editor)
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
    if _mysql(schema_editor, MYSQL_FLOW_BACKWARD):
        return
    job = apps.get_model("django_gator", "Job")
    for index in flow_indexes():
        schema_editor.remove_index(job, index)
    [new_ready, *_] = partial_indexes(flow=True)
    schema_editor.remove_index(job, new_ready)
    [old_ready, *_] = partial_indexes()
    schema_editor.add_index(job, old_ready)


# -- unique jobs (migration 0003) ------------------------------------------------------------


def create_unique(apps: Any, schema_editor: Any) -> None:
    if _mysql(schema_editor, MYSQL_UNIQUE_FORWARD):
        return
    job = apps.get_model("django_gator", "Job")
    restore_claim_indexes(job, schema_editor)
    schema_editor.add_constraint(job, unique_constraint())


def drop_unique(apps: Any, schema_editor: Any) -> None:
    if _mysql(schema_editor, MYSQL_UNIQUE_BACKWARD):
        return
    schema_editor.remove_constraint(apps.get_model("django_gator", "Job"), unique_constraint())


def restore_claim_indexes(job: Any, schema_editor: Any, *, unique: bool = False) -> None:
    """Re-create the partial indexes of migration 0002 (and, with ``unique``, the unique
    index of 0003) where they are missing.

    On SQLite, a migration that changes the table in a way ALTER TABLE cannot (such as
    adding a NOT NULL column) copies it into a new table built from the migration state, in
    which these indexes do not appear: every such migration must call this afterwards.
    """
    existing = table_indexes(job, schema_editor)
    flow = has_flow(job)
    for index in partial_indexes(flow=flow) + (flow_indexes() if flow else []):
        if index.name not in existing:
            schema_editor.add_index(job, index)
    if unique and unique_constraint().name not in existing:
        schema_editor.add_constraint(job, unique_constraint())


# -- the dead-job screen (migration 0005) ----------------------------------------------------


def create_groups_index(apps: Any, schema_editor: Any) -> None:
    if _mysql(schema_editor):
        return
    job = apps.get_model("django_gator", "Job")
    restore_claim_indexes(job, schema_editor, unique=True)
    schema_editor.add_index(job, groups_index())


def drop_groups_index(apps: Any, schema_editor: Any) -> None:
    if _mysql(schema_editor):
        return
    schema_editor.remove_index(apps.get_model("django_gator", "Job"), groups_index())


def restore_groups_index(job: Any, schema_editor: Any) -> None:
    """Re-create the dead-job screen's index of migration 0005 where it is missing (see
    restore_claim_indexes: SQLite table rebuilds drop it)."""
    add_missing(job, schema_editor, groups_index())


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
            add_missing(job, schema_editor, batch_index())
        if any(field.name == "dedupe_key" for field in job._meta.fields):
            from django_gator.engines.schema_dedupe import restore_dedupe_indexes  # its layer

            restore_dedupe_indexes(job, schema_editor)
        if any(field.name == "fair_order" for field in job._meta.fields):
            from django_gator.engines.schema_fairness import restore_fair_index

            restore_fair_index(job, schema_editor)


# -- the queue figures' dead counts (migration 0018) -----------------------------------------


def create_dead_queue_index(apps: Any, schema_editor: Any) -> None:
    """On PostgreSQL ``CREATE INDEX CONCURRENTLY`` (see schema_concurrent.build_concurrently)."""
    create_partial(apps, schema_editor, dead_queue_index(), ("dead",))


def restore_dead_queue_index(job: Any, schema_editor: Any) -> None:
    """Create 0018's index where it is missing (on SQLite, a later migration that rebuilds
    the table must call this, as those before it call restore_after_rebuild)."""
    add_missing(job, schema_editor, dead_queue_index())


def drop_dead_queue_index(apps: Any, schema_editor: Any) -> None:
    drop_partial(apps, schema_editor, dead_queue_index(), ("dead",))


# -- batch members (migration 0017) ----------------------------------------------------------


def create_batch_index(apps: Any, schema_editor: Any) -> None:
    """PostgreSQL and SQLite: the partial index first (the queries keep an index while it
    is built), then drop the full one. Each step checks what exists, so a migration cut
    off between the two (it is not atomic) can run again."""
    if _mysql(schema_editor):
        return
    job = apps.get_model("django_gator", "Job")
    add_missing(job, schema_editor, batch_index())
    if FULL_BATCH_INDEX in table_indexes(job, schema_editor):
        schema_editor.remove_index(job, full_batch_index())


def drop_batch_index(apps: Any, schema_editor: Any) -> None:
    if _mysql(schema_editor):
        return
    job = apps.get_model("django_gator", "Job")
    add_missing(job, schema_editor, full_batch_index())
    if batch_index().name in table_indexes(job, schema_editor):
        schema_editor.remove_index(job, batch_index())


# -- upkeep ------------------------------------------------------------------------------------


def vacuum_jobs(engine: JobEngine) -> None:
    """PostgreSQL, outside a transaction: VACUUM ANALYZE the jobs table (its dead rows gone,
    its statistics fresh). Elsewhere, or inside a transaction, nothing."""
    engine = behind(engine)
    connection = engine.connection
    if engine.vendor == "postgresql" and not connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM ANALYZE {engine.job_table}")


# -- the error-class filter's estimate (migration 0030) ---------------------------------------

#: PostgreSQL's statistics of the jobs' (state, error_class) pairs: the most common ones and
#: how often each occurs.
ERROR_STATISTICS = "gator_job_state_error"


def create_error_statistics(apps: Any, schema_editor: Any) -> None:
    """PostgreSQL: extended statistics (the most common values) of ``state`` and
    ``error_class`` together, and an ANALYZE of those two columns (a sample: seconds, and
    writers are not blocked). Without them the planner takes the two for unrelated and
    expects a class's dead jobs to be 1 % of what they are (the dead jobs are 1 % of the
    table), and the job list filtered by error class sorts every job of the class (523 ms
    at 20,000,000 rows, 200,000 dead). Elsewhere nothing."""
    if schema_editor.connection.vendor != "postgresql":
        return
    qn = schema_editor.connection.ops.quote_name
    table = qn(apps.get_model("django_gator", "Job")._meta.db_table)
    schema_editor.execute(
        f"CREATE STATISTICS IF NOT EXISTS {qn(ERROR_STATISTICS)} (mcv) ON state, error_class"
        f" FROM {table}"
    )
    schema_editor.execute(f"ANALYZE {table} (state, error_class)")


def drop_error_statistics(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        name = schema_editor.connection.ops.quote_name(ERROR_STATISTICS)
        schema_editor.execute(f"DROP STATISTICS IF EXISTS {name}")
