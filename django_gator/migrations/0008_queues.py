"""Queues with a row of their own: paused (by whom, since when), who changed them last, and
the pause permission. Every claim reads the row of the queue it claims from."""

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_gator", "0007_snoozes"),
    ]

    operations = [
        migrations.CreateModel(
            name="Queue",
            fields=[
                ("name", models.CharField(max_length=100, primary_key=True, serialize=False)),
                (
                    "paused",
                    models.BooleanField(
                        db_default=False,
                        default=False,
                        help_text="No worker claims this queue's jobs.",
                    ),
                ),
                ("paused_at", models.DateTimeField(blank=True, null=True)),
                (
                    "paused_by",
                    models.CharField(
                        blank=True,
                        default="",
                        help_text="Who paused it (user or caller).",
                        max_length=150,
                    ),
                ),
                ("updated_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "updated_by",
                    models.CharField(
                        blank=True,
                        default="",
                        help_text="Who changed the row last (paused or resumed the queue).",
                        max_length=150,
                    ),
                ),
            ],
            options={
                "db_table": "django_gator_queue",
                "ordering": ["name"],
                "permissions": [("pause_queue", "Can pause and resume queues")],
            },
        ),
    ]
