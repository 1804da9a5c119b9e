"""``awaited`` on jobs and workflow steps: NULL unless ``wait_result()`` set it, on
PostgreSQL, where triggers NOTIFY the waiter when a flagged row ends
(django_gator/engines/ends.py). NULL-able with no default, so every database adds the
columns without rewriting the tables, and rows written by the version before (a rolling
upgrade) are simply not awaited."""

from django.db import migrations, models

from django_gator.engines import ends


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [
        ("django_gator", "0025_encryption"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="awaited",
            field=models.BooleanField(
                editable=False,
                null=True,
                help_text="Set by wait_result() on PostgreSQL: the job's end sends a NOTIFY.",
            ),
        ),
        migrations.AddField(
            model_name="workflowstep",
            name="awaited",
            field=models.BooleanField(
                editable=False,
                null=True,
                help_text="Set by wait_result() on PostgreSQL: the step's end sends a NOTIFY.",
            ),
        ),
        migrations.RunPython(ends.create_triggers, ends.drop_triggers),
    ]
