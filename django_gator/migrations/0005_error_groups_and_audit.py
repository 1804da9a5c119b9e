"""The dead-job screen: the error class it groups on, and an audit trail of operator actions."""

from django.db import migrations, models

from django_gator.engines import schema


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [
        ("django_gator", "0004_schedules"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="audit",
            field=models.JSONField(
                blank=True,
                help_text="Operator actions on this job (retries, edits, discards): who, when, what.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="error_class",
            field=models.CharField(
                blank=True,
                help_text="Exception class of the last failed attempt (groups the dead-job screen).",
                max_length=255,
                null=True,
            ),
        ),
        migrations.RunPython(schema.create_groups_index, schema.drop_groups_index),
    ]
