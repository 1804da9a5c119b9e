"""Two counters on a job: ``handbacks``, the times a stopping worker gave it back to
``waiting`` while it ran (a job that never ends is charged an attempt after
GATOR_MAX_HANDBACKS of them), and ``outages``, the attempts cut short by a lost database
connection, retried without charging the job's retry budget (up to GATOR_OUTAGE_RETRIES)."""

from typing import Any

from django.db import migrations, models

from django_gator.engines import schema


def restore_indexes(apps: Any, schema_editor: Any) -> None:
    """SQLite rebuilds the table to add NOT NULL columns, dropping the partial indexes of
    0002-0017 and 0018's dead-queue index: put them back."""
    schema.restore_after_rebuild(apps, schema_editor)
    if schema_editor.connection.vendor == "sqlite":
        schema.restore_dead_queue_index(apps.get_model("django_gator", "Job"), schema_editor)


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [
        ("django_gator", "0018_dead_queue_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="handbacks",
            field=models.PositiveIntegerField(
                db_default=0,
                default=0,
                help_text="Times a stopping worker gave the job back to waiting while it ran.",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="outages",
            field=models.PositiveIntegerField(
                db_default=0,
                default=0,
                help_text="Attempts cut short by a lost database connection, retried uncharged.",
            ),
        ),
        migrations.RunPython(restore_indexes, migrations.RunPython.noop),
    ]
