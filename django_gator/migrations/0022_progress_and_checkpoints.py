"""Long-running jobs: ``progress`` (the last progress() of a run) and ``checkpoint_data``
(the state the next attempt resumes from). Both are NULL-able with no default, so every
database adds them without rewriting the table (SQLite too: no rebuild, so the partial
indexes stay)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [
        ("django_gator", "0021_workflow_waits"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="progress",
            field=models.JSONField(
                blank=True,
                null=True,
                help_text="The last progress() of a run: done, total, note (and rate, at).",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="checkpoint_data",
            field=models.JSONField(
                blank=True,
                null=True,
                help_text="The last checkpoint() written: the next attempt resumes from it.",
            ),
        ),
    ]
