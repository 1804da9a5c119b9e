"""The claim and rescue indexes, built to suit each database (see django_gator.indexes and
django_gator.engines.schema)."""

from django.db import migrations

from django_gator.engines import schema


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [("django_gator", "0001_initial")]

    operations = [migrations.RunPython(schema.create, schema.drop)]
