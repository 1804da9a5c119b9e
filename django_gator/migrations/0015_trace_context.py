"""The OpenTelemetry context of each job's dispatch, so that its runs continue the trace.

A nullable column without a default: PostgreSQL and MariaDB (10.3+, instant ADD COLUMN)
add it without rewriting or locking the jobs table for longer than a metadata change."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_gator", "0014_wakeup_address"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="trace_context",
            field=models.JSONField(
                blank=True,
                help_text="OpenTelemetry context of the dispatch (traceparent), continued by each run.",
                null=True,
            ),
        ),
    ]
