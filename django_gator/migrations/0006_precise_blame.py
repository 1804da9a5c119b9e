"""Precise blame for crashes: a rescued job is a suspect and runs alone; only the workers
lost while it ran alone count toward its poison-pill limit."""

from django.db import migrations, models

from django_gator.engines import schema


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [
        ("django_gator", "0005_error_groups_and_audit"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="suspect",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="Taken back from a lost worker: runs alone until it ends.",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="isolated",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="This attempt runs alone in its worker (a suspect's test run).",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="crashes",
            field=models.PositiveSmallIntegerField(
                db_default=0,
                default=0,
                help_text="Workers lost while this job ran alone in them: crashes it caused.",
            ),
        ),
        # SQLite rebuilds the table to add NOT NULL columns, dropping the partial indexes.
        migrations.RunPython(schema.restore_after_rebuild, migrations.RunPython.noop),
    ]
