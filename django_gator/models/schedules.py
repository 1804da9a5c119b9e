"""Cron schedules and the record of each occurrence dispatched."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models
from django.utils import timezone
from django.utils.timezone import now as _now

from django_gator.cron import next_occurrence
from django_gator.validation import NAME_MAX_LENGTH, QUEUE_MAX_LENGTH


class ScheduleSource(models.TextChoices):
    CODE = "code", "Job class"
    SETTINGS = "settings", "GATOR_SCHEDULES"
    ADMIN = "admin", "Admin"


class MisfirePolicy(models.TextChoices):
    SKIP = "skip", "Skip missed occurrences"
    ONCE = "once", "Run once after a downtime"
    CATCH_UP = "catch_up", "Run every missed occurrence (up to the limit)"


class Schedule(models.Model):
    """A cron schedule: every worker's scheduler dispatches ``job_name`` at each occurrence,
    and the ``ScheduledRun`` table makes each occurrence run once across all of them."""

    name = models.CharField(max_length=200, unique=True)
    job_name = models.CharField(max_length=NAME_MAX_LENGTH, help_text="A registered job name.")
    cron = models.CharField(
        max_length=200, help_text="Five fields: minute hour day-of-month month day-of-week."
    )
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    queue = models.CharField(
        max_length=QUEUE_MAX_LENGTH, blank=True, default="", help_text="Empty: the job's queue."
    )
    priority = models.SmallIntegerField(
        null=True, blank=True, help_text="Empty: the job's priority."
    )
    timezone = models.CharField(
        max_length=64, default="UTC", help_text="IANA time zone the cron fields are read in."
    )
    enabled = models.BooleanField(default=True)
    misfire = models.CharField(
        max_length=16, choices=MisfirePolicy.choices, default=MisfirePolicy.ONCE
    )
    catch_up_limit = models.PositiveIntegerField(
        default=100, help_text="Most missed occurrences run by the catch-up policy."
    )
    overlap = models.BooleanField(
        default=True,
        help_text="Dispatch even while the previous run is still waiting, retrying or running.",
    )
    source = models.CharField(
        max_length=16, choices=ScheduleSource.choices, default=ScheduleSource.ADMIN
    )
    anchor_at = models.DateTimeField(
        default=_now, help_text="Occurrences after this instant count."
    )
    last_run_at = models.DateTimeField(
        null=True, blank=True, help_text="The last occurrence handled (run or skipped)."
    )
    next_run_at = models.DateTimeField(null=True, blank=True)
    last_job_id = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=_now)
    updated_at = models.DateTimeField(default=_now)

    class Meta:
        ordering = ["name"]
        indexes = [models.Index(fields=["enabled", "next_run_at"], name="gator_schedule_due")]
        permissions = [("run_schedule", "Can run a schedule's job now")]

    def __str__(self) -> str:
        return f"{self.name} ({self.cron} {self.timezone})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Saving a new timing (cron or time zone) starts counting from now: occurrences of
        the old timing are not caught up. next_run_at is recomputed either way."""
        if self.pk is not None:
            old = Schedule.objects.using(self._state.db or "default").filter(pk=self.pk)
            previous = old.values_list("cron", "timezone").first()
            if previous is not None and previous != (self.cron, self.timezone):
                self.anchor_at = timezone.now()
                self.last_run_at = None
        self.updated_at = timezone.now()
        self.next_run_at = self.compute_next_run()
        if kwargs.get("update_fields") is not None:
            kwargs["update_fields"] = {
                *kwargs["update_fields"],
                "anchor_at",
                "last_run_at",
                "next_run_at",
                "updated_at",
            }
        super().save(*args, **kwargs)

    def compute_next_run(self) -> datetime | None:
        after = self.anchor_at
        if self.last_run_at is not None and self.last_run_at > after:
            after = self.last_run_at
        try:
            return next_occurrence(self.cron, self.timezone, after)
        except ValueError:
            return None


class ScheduledRun(models.Model):
    """One occurrence of a schedule, handled once: the unique (schedule, occurrence_at) row
    is inserted in the transaction that dispatches the job, so a second worker's insert
    fails and it dispatches nothing."""

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="runs")
    occurrence_at = models.DateTimeField()
    job_id = models.BigIntegerField(null=True, blank=True)
    skipped = models.BooleanField(
        default=False, help_text="Not dispatched: the previous run had not finished."
    )
    created_at = models.DateTimeField(default=_now)

    class Meta:
        ordering = ["-occurrence_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["schedule", "occurrence_at"], name="gator_schedule_occurrence_once"
            )
        ]
        indexes = [models.Index(fields=["occurrence_at"], name="gator_scheduledrun_at")]

    def __str__(self) -> str:
        return f"{self.schedule_id} @ {self.occurrence_at.isoformat()}"
