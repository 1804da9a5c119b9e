"""Captured logs: ``logs``, the log lines each attempt of a job emitted, one entry per
attempt. NULL-able with no default, so every database adds it without rewriting the table
(SQLite too: no rebuild, so the partial indexes stay)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [
        ("django_gator", "0022_progress_and_checkpoints"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="captured_logs",
            field=models.JSONField(
                blank=True,
                db_column="logs",
                help_text="Log records each attempt emitted (see GATOR_JOB_LOG_LEVEL), per attempt.",
                null=True,
            ),
        ),
    ]
