"""The claim and rescue indexes, built to suit each database (see django_gator.indexes)."""

from django.db import migrations

from django_gator import indexes


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [("django_gator", "0001_initial")]

    operations = [migrations.RunPython(indexes.create, indexes.drop)]
