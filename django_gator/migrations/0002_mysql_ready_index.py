"""MySQL and MariaDB have no partial indexes, so the claim index of 0001 is not created
there. This adds its equivalent: a virtual column that is ``-priority`` while the job is
waiting or failed and NULL otherwise, and an index that the claim query walks in order.
Other databases skip this migration."""

from typing import Any

from django.db import migrations

MYSQL_FORWARD = [
    "ALTER TABLE django_gator_job ADD COLUMN ready_rank smallint GENERATED ALWAYS AS "
    "(CASE WHEN state IN ('waiting', 'failed') THEN -priority ELSE NULL END) VIRTUAL",
    "CREATE INDEX gator_job_ready_my ON django_gator_job (queue, ready_rank, next_execution_at, id)",
    "CREATE INDEX gator_job_running_my ON django_gator_job (state, reserved_by)",
]
MYSQL_BACKWARD = [
    "DROP INDEX gator_job_running_my ON django_gator_job",
    "DROP INDEX gator_job_ready_my ON django_gator_job",
    "ALTER TABLE django_gator_job DROP COLUMN ready_rank",
]


def _run(statements: list[str]) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor != "mysql":
            return
        for sql in statements:
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [("django_gator", "0001_initial")]

    operations = [migrations.RunPython(_run(MYSQL_FORWARD), _run(MYSQL_BACKWARD))]
