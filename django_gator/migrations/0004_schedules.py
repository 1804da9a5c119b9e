"""Cron schedules: the Schedule table and the ScheduledRun table that makes each occurrence run once."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_gator", "0003_unique_and_cancel"),
    ]

    operations = [
        migrations.CreateModel(
            name="Schedule",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=200, unique=True)),
                ("job_name", models.CharField(help_text="A registered job name.", max_length=255)),
                (
                    "cron",
                    models.CharField(
                        help_text="Five fields: minute hour day-of-month month day-of-week.",
                        max_length=200,
                    ),
                ),
                ("args", models.JSONField(blank=True, default=list)),
                ("kwargs", models.JSONField(blank=True, default=dict)),
                (
                    "queue",
                    models.CharField(
                        blank=True, default="", help_text="Empty: the job's queue.", max_length=100
                    ),
                ),
                (
                    "priority",
                    models.SmallIntegerField(
                        blank=True, help_text="Empty: the job's priority.", null=True
                    ),
                ),
                (
                    "timezone",
                    models.CharField(
                        default="UTC",
                        help_text="IANA time zone the cron fields are read in.",
                        max_length=64,
                    ),
                ),
                ("enabled", models.BooleanField(default=True)),
                (
                    "misfire",
                    models.CharField(
                        choices=[
                            ("skip", "Skip missed occurrences"),
                            ("once", "Run once after a downtime"),
                            ("catch_up", "Run every missed occurrence (up to the limit)"),
                        ],
                        default="once",
                        max_length=16,
                    ),
                ),
                (
                    "catch_up_limit",
                    models.PositiveIntegerField(
                        default=100, help_text="Most missed occurrences run by the catch-up policy."
                    ),
                ),
                (
                    "overlap",
                    models.BooleanField(
                        default=True,
                        help_text="Dispatch even while the previous run is still waiting, retrying or running.",
                    ),
                ),
                (
                    "source",
                    models.CharField(
                        choices=[
                            ("code", "Job class"),
                            ("settings", "GATOR_SCHEDULES"),
                            ("admin", "Admin"),
                        ],
                        default="admin",
                        max_length=16,
                    ),
                ),
                (
                    "anchor_at",
                    models.DateTimeField(
                        default=django.utils.timezone.now,
                        help_text="Occurrences after this instant count.",
                    ),
                ),
                (
                    "last_run_at",
                    models.DateTimeField(
                        blank=True,
                        help_text="The last occurrence handled (run or skipped).",
                        null=True,
                    ),
                ),
                ("next_run_at", models.DateTimeField(blank=True, null=True)),
                ("last_job_id", models.BigIntegerField(blank=True, null=True)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("updated_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={
                "ordering": ["name"],
                "permissions": [("run_schedule", "Can run a schedule's job now")],
                "indexes": [
                    models.Index(fields=["enabled", "next_run_at"], name="gator_schedule_due")
                ],
            },
        ),
        migrations.CreateModel(
            name="ScheduledRun",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("occurrence_at", models.DateTimeField()),
                ("job_id", models.BigIntegerField(blank=True, null=True)),
                (
                    "skipped",
                    models.BooleanField(
                        default=False,
                        help_text="Not dispatched: the previous run had not finished.",
                    ),
                ),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "schedule",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="runs",
                        to="django_gator.schedule",
                    ),
                ),
            ],
            options={
                "ordering": ["-occurrence_at"],
                "indexes": [models.Index(fields=["occurrence_at"], name="gator_scheduledrun_at")],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("schedule", "occurrence_at"), name="gator_schedule_occurrence_once"
                    )
                ],
            },
        ),
    ]
