"""PostgreSQL: extended statistics of the jobs' (state, error_class) pairs, so that the
planner expects as many dead jobs of a class as there are, and the job list filtered by
error class reads its page by the primary key instead of sorting every job of the class
(django_gator.engines.schema.create_error_statistics). Other databases: nothing."""

from django.db import migrations

from django_gator.engines import schema


class Migration(migrations.Migration):
    atomic = False  # ANALYZE, then no transaction held
    dependencies = [
        ("django_gator", "0029_open_steps_index"),
    ]

    operations = [
        migrations.RunPython(schema.create_error_statistics, schema.drop_error_statistics),
    ]
