"""The workflow gauges' index (PostgreSQL and SQLite): the sleep and wait steps not ended,
by name and queue, so that a metrics scrape reads those rows alone instead of every
unfinished job (django_gator.indexes.open_steps_index).

PostgreSQL builds it with CREATE INDEX CONCURRENTLY (writers are not blocked while it
reads the table; on partitioned storage, on the active partition), which cannot run in a
transaction: the migration is not atomic."""

from django.db import migrations

from django_gator.engines import schema_concurrent


class Migration(migrations.Migration):
    atomic = False
    dependencies = [
        ("django_gator", "0028_finished_tally"),
    ]

    operations = [
        migrations.RunPython(
            schema_concurrent.create_open_steps_index, schema_concurrent.drop_open_steps_index
        ),
    ]
