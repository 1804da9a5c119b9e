"""The triggers that tell a waiter its job or workflow has ended (PostgreSQL only).

``Job.wait_result()`` on PostgreSQL flags the row it waits for (``awaited``: NULL unless a
waiter set it) and LISTENs on :data:`ENDS_CHANNEL`. An AFTER UPDATE OF state trigger sends
``pg_notify(ENDS_CHANNEL, 'j<id>')`` when a flagged job reaches a final state, and one on
the steps ``'r<workflow id>'`` when a flagged step settles: whichever statement writes the
end (the batched success mark inside the claim's round trip, a failure, a cancel, a
rescue, a discard, an operator's verb), the NOTIFY goes out at its commit. A row nobody
waits for costs its trigger's WHEN test (``NEW.awaited`` is NULL): no NOTIFY, no call of
the function. SQLite and MySQL get no trigger: their waiters read (models/awaiting.py).
"""

from __future__ import annotations

from typing import Any

from django_gator.states import FINAL_STATES, StepState, sql_list

#: The LISTEN/NOTIFY channel of ends; the payload is ``j<job id>`` or ``r<workflow id>``.
ENDS_CHANNEL = "django_gator_ends"

#: The states of a step that has not settled, as an SQL list.
OPEN_STEPS_SQL = (
    "(" + ", ".join(f"'{s.value}'" for s in (StepState.BLOCKED, StepState.RELEASED)) + ")"
)

#: The jobs table's trigger ({job}: the table), also moved by a conversion to or from
#: partitioned storage (engines/partition_conversion.py).
JOB_TRIGGER = (
    "CREATE TRIGGER django_gator_job_ended AFTER UPDATE OF state ON {job} FOR EACH ROW"
    f" WHEN (NEW.awaited AND NEW.state IN {sql_list(FINAL_STATES)})"
    " EXECUTE FUNCTION django_gator_job_ended()"
)

#: On partitioned storage a job's end moves its row to another partition, which PostgreSQL
#: runs as a DELETE and an INSERT: no AFTER UPDATE trigger fires, the INSERT's does.
ARRIVAL_TRIGGER = (
    "CREATE TRIGGER django_gator_job_arrived AFTER INSERT ON {job} FOR EACH ROW"
    f" WHEN (NEW.awaited AND NEW.state IN {sql_list(FINAL_STATES)})"
    " EXECUTE FUNCTION django_gator_job_ended()"
)

FORWARD = [
    "CREATE OR REPLACE FUNCTION django_gator_job_ended() RETURNS trigger LANGUAGE plpgsql"
    f" AS $$ BEGIN PERFORM pg_notify('{ENDS_CHANNEL}', 'j' || NEW.id::text); RETURN NULL;"
    " END $$",
    JOB_TRIGGER,
    "CREATE OR REPLACE FUNCTION django_gator_step_settled() RETURNS trigger LANGUAGE plpgsql"
    f" AS $$ BEGIN PERFORM pg_notify('{ENDS_CHANNEL}', 'r' || NEW.workflow_id::text);"
    " RETURN NULL; END $$",
    "CREATE TRIGGER django_gator_step_settled AFTER UPDATE OF state ON {step} FOR EACH ROW"
    f" WHEN (NEW.awaited AND NEW.state NOT IN {OPEN_STEPS_SQL})"
    " EXECUTE FUNCTION django_gator_step_settled()",
]
BACKWARD = [
    "DROP TRIGGER IF EXISTS django_gator_step_settled ON {step}",
    "DROP FUNCTION IF EXISTS django_gator_step_settled()",
    "DROP TRIGGER IF EXISTS django_gator_job_arrived ON {job}",
    "DROP TRIGGER IF EXISTS django_gator_job_ended ON {job}",
    "DROP FUNCTION IF EXISTS django_gator_job_ended()",
]


def _run(apps: Any, schema_editor: Any, statements: list[str]) -> None:
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    qn = connection.ops.quote_name
    tables = {
        "job": qn(apps.get_model("django_gator", "Job")._meta.db_table),
        "step": qn(apps.get_model("django_gator", "WorkflowStep")._meta.db_table),
    }
    for statement in statements:
        schema_editor.execute(statement.format(**tables) if "{" in statement else statement)


def create_triggers(apps: Any, schema_editor: Any) -> None:
    """Migration 0026's forward step (on a jobs table already partitioned, the arrival
    trigger too)."""
    _run(apps, schema_editor, FORWARD)
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    table = apps.get_model("django_gator", "Job")._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = %s::regclass", [table])
        if cursor.fetchone()[0] == "p":
            cursor.execute(ARRIVAL_TRIGGER.format(job=connection.ops.quote_name(table)))


def drop_triggers(apps: Any, schema_editor: Any) -> None:
    """Migration 0026's backward step."""
    _run(apps, schema_editor, BACKWARD)


def move_job_trigger(cursor: Any, qn: Any, source: str, target: str, *, partitioned: bool) -> None:
    """Move the jobs table's end triggers from table ``source`` to ``target`` (a
    conversion swapped them; ``partitioned``: the new ``target`` is), if migration 0026
    installed them."""
    cursor.execute("SELECT 1 FROM pg_proc WHERE proname = 'django_gator_job_ended'")
    if cursor.fetchone() is None:
        return
    for table in (source, target):
        for name in ("django_gator_job_ended", "django_gator_job_arrived"):
            cursor.execute(f"DROP TRIGGER IF EXISTS {name} ON {qn(table)}")
    cursor.execute(JOB_TRIGGER.format(job=qn(target)))
    if partitioned:
        cursor.execute(ARRIVAL_TRIGGER.format(job=qn(target)))
