"""Unique jobs and cooperative cancellation: two columns, and the unique index built to suit
each database (see django_gator.indexes and django_gator.engines.schema)."""

from django.db import migrations, models

from django_gator.engines import schema


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [("django_gator", "0002_claim_indexes")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="unique_key",
            field=models.CharField(
                blank=True,
                help_text="At most one waiting, failed or running job per job name and key.",
                max_length=200,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="cancel_requested",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="Cancellation asked for while running; the job may stop early.",
            ),
        ),
        migrations.RunPython(schema.create_unique, schema.drop_unique),
    ]
