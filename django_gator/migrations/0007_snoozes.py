"""Snooze: how many times a job put itself back to waiting (raise Snooze(...))."""

from django.db import migrations, models

from django_gator.engines import schema


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [
        ("django_gator", "0006_precise_blame"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="snoozes",
            field=models.PositiveIntegerField(
                db_default=0,
                default=0,
                help_text="Times handle() raised Snooze: back to waiting, no attempt counted.",
            ),
        ),
        # SQLite rebuilds the table to add NOT NULL columns, dropping the partial indexes.
        migrations.RunPython(schema.restore_after_rebuild, migrations.RunPython.noop),
    ]
