"""Windows and expiry: ``dedupe_key`` (the key of a class with unique_for, debounce or
throttle) and ``expires_at`` (a job not started by then never runs), with their indexes
built to suit each database (see django_gator.engines.schema_dedupe). Both columns are
NULL-able with no default: no table rewrite (SQLite too: no rebuild)."""

from django.db import migrations, models

from django_gator.engines import schema_dedupe


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [
        ("django_gator", "0023_job_logs"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="dedupe_key",
            field=models.CharField(
                blank=True,
                help_text="The key of a class with unique_for, debounce or throttle: its "
                "window (after the job finished, or before it starts) is counted under it.",
                max_length=200,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="expires_at",
            field=models.DateTimeField(
                blank=True,
                help_text="Not started by then: never runs (ends cancelled, reason 'expired').",
                null=True,
            ),
        ),
        migrations.RunPython(schema_dedupe.create_dedupe, schema_dedupe.drop_dedupe),
    ]
