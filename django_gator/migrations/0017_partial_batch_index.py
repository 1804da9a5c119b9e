"""The index of batch members by state holds only the rows of batch members (PostgreSQL,
SQLite): most jobs are in no batch, and their claims and outcome marks no longer write it.
MySQL and MariaDB, which have no partial indexes, keep 0012's index."""

from django.db import migrations

from django_gator import indexes
from django_gator.engines import schema


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [
        ("django_gator", "0016_workflow_batch_steps"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="job", name=indexes.FULL_BATCH_INDEX),
            ],
            database_operations=[
                migrations.RunPython(schema.create_batch_index, schema.drop_batch_index),
            ],
        ),
    ]
