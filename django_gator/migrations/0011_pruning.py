"""Leases: a duty one worker of the fleet holds at a time (the automatic pruner's). A new
small table: nothing else is locked or rewritten."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_gator", "0010_worker_supervisor"),
    ]

    operations = [
        migrations.CreateModel(
            name="Lease",
            fields=[
                ("name", models.CharField(max_length=64, primary_key=True, serialize=False)),
                (
                    "holder",
                    models.CharField(help_text="The worker id that holds it.", max_length=255),
                ),
                (
                    "expires_at",
                    models.DateTimeField(help_text="Free for another holder after this time."),
                ),
            ],
            options={
                "db_table": "django_gator_lease",
            },
        ),
    ]
