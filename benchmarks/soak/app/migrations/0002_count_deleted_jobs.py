"""A trigger on django_gator_job that counts every deleted row by job name and state into
gator_soak_deletedjobs, so that the soak's outcome count survives the automatic pruner:
finished jobs = the rows still in the table + the rows deleted in a final state, and a
row deleted while waiting, failed or running would show as a loss."""

from __future__ import annotations

from typing import Any

from django.db import migrations

TALLY = "gator_soak_deletedjobs"

POSTGRESQL = [
    f"""CREATE FUNCTION gator_soak_count_deleted() RETURNS trigger AS $$
BEGIN
    INSERT INTO {TALLY} (name, state, count)
    SELECT name, state, count(*) FROM gator_soak_old GROUP BY name, state
    ON CONFLICT (name, state) DO UPDATE SET count = {TALLY}.count + EXCLUDED.count;
    RETURN NULL;
END $$ LANGUAGE plpgsql""",
    "CREATE TRIGGER gator_soak_count_deleted AFTER DELETE ON django_gator_job "
    "REFERENCING OLD TABLE AS gator_soak_old FOR EACH STATEMENT "
    "EXECUTE FUNCTION gator_soak_count_deleted()",
]
POSTGRESQL_DROP = [
    "DROP TRIGGER IF EXISTS gator_soak_count_deleted ON django_gator_job",
    "DROP FUNCTION IF EXISTS gator_soak_count_deleted()",
]
MYSQL = [
    "CREATE TRIGGER gator_soak_count_deleted AFTER DELETE ON django_gator_job FOR EACH ROW "
    f"INSERT INTO {TALLY} (name, state, count) VALUES (OLD.name, OLD.state, 1) "
    "ON DUPLICATE KEY UPDATE count = count + 1"
]
SQLITE = [
    "CREATE TRIGGER gator_soak_count_deleted AFTER DELETE ON django_gator_job FOR EACH ROW "
    f"BEGIN INSERT INTO {TALLY} (name, state, count) VALUES (OLD.name, OLD.state, 1) "
    "ON CONFLICT (name, state) DO UPDATE SET count = count + 1; END"
]
DROP = ["DROP TRIGGER IF EXISTS gator_soak_count_deleted"]


def _run(schema_editor: Any, statements: dict[str, list[str]]) -> None:
    vendor = schema_editor.connection.vendor
    if vendor not in statements:
        raise RuntimeError(f"the soak's deleted-jobs trigger has no {vendor!r} version")
    # A cursor of its own: MySQL's schema editor refuses DDL inside the migration's
    # transaction (a CREATE TRIGGER there commits it).
    with schema_editor.connection.cursor() as cursor:
        for sql in statements[vendor]:
            cursor.execute(sql)


def create(apps: Any, schema_editor: Any) -> None:
    _run(schema_editor, {"postgresql": POSTGRESQL, "mysql": MYSQL, "sqlite": SQLITE})


def drop(apps: Any, schema_editor: Any) -> None:
    _run(schema_editor, {"postgresql": POSTGRESQL_DROP, "mysql": DROP, "sqlite": DROP})


class Migration(migrations.Migration):
    dependencies = [
        ("gator_soak", "0001_initial"),
        ("django_gator", "0015_trace_context"),
    ]

    operations = [migrations.RunPython(create, drop)]
