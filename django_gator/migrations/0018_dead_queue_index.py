"""The dead jobs by queue, a partial index (PostgreSQL and SQLite): the Prometheus view's
one statement counts them from the index alone, however many dead jobs are kept.

PostgreSQL builds it with CREATE INDEX CONCURRENTLY (writers are not blocked while it
reads the table), which cannot run in a transaction: the migration is not atomic."""

from django.db import migrations

from django_gator.engines import schema


class Migration(migrations.Migration):
    atomic = False
    dependencies = [
        ("django_gator", "0017_partial_batch_index"),
    ]

    operations = [
        migrations.RunPython(schema.create_dead_queue_index, schema.drop_dead_queue_index),
    ]
