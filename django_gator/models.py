"""The jobs table and the worker heartbeat table.

Hot paths (dispatch, claim, outcome writes, rescue) are SQL in :mod:`django_gator.engines`,
one module per database; the model declares the schema, the indexes the claim query needs,
and the domain verbs used by the admin and the management commands.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models
from django.utils import timezone

from django_gator.dbtime import DbNow
from django_gator.validation import (
    NAME_MAX_LENGTH,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUEUE_MAX_LENGTH,
)


class JobState(models.TextChoices):
    """Where a job is in its life.

    ``waiting``: ready now, or scheduled for ``next_execution_at``.
    ``running``: claimed by the worker named in ``reserved_by``.
    ``succeeded``: ``handle()`` returned.
    ``failed``: ``handle()`` raised and the retry policy will run it again at
    ``next_execution_at``.
    ``dead``: no more attempts (retries exhausted, no retry policy, an unknown job name,
    or the job kept killing its worker). Only an operator brings it back.
    ``cancelled``: an operator or the code cancelled it before it ran.
    """

    WAITING = "waiting", "Waiting"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed (will retry)"
    DEAD = "dead", "Dead"
    CANCELLED = "cancelled", "Cancelled"


#: States a worker may claim from once ``next_execution_at`` has passed.
READY_STATES = (JobState.WAITING, JobState.FAILED)
#: States no worker ever leaves on its own.
FINAL_STATES = (JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED)


class JobQuerySet(models.QuerySet["Job"]):
    def ready(self) -> JobQuerySet:
        """Jobs a worker may claim now."""
        return self.filter(state__in=READY_STATES, next_execution_at__lte=DbNow())

    def scheduled(self) -> JobQuerySet:
        return self.filter(state__in=READY_STATES, next_execution_at__gt=DbNow())

    def running(self) -> JobQuerySet:
        return self.filter(state=JobState.RUNNING)

    def dead(self) -> JobQuerySet:
        return self.filter(state=JobState.DEAD)

    def stale(self, *, before: datetime) -> JobQuerySet:
        """Running jobs whose claim is older than ``before``."""
        return self.running().filter(locked_at__lt=before)

    def retry(self) -> int:
        """Make dead and failed jobs due now; returns how many rows changed.

        Attempts and the error history are kept: the next claim counts on from them.
        """
        return self.filter(state__in=(JobState.DEAD, JobState.FAILED)).update(
            state=JobState.WAITING, next_execution_at=DbNow(), finished_at=None
        )

    def cancel(self) -> int:
        """Cancel jobs that have not started; running and finished rows are left alone."""
        return self.filter(state__in=READY_STATES).update(
            state=JobState.CANCELLED, finished_at=DbNow()
        )


class Job(models.Model):
    """One unit of work: a registered job name and its JSON arguments."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=NAME_MAX_LENGTH, help_text="Registered job name.")
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    queue = models.CharField(max_length=QUEUE_MAX_LENGTH, default="default", db_default="default")
    priority = models.SmallIntegerField(
        default=0, db_default=0, help_text="Higher runs first within a queue."
    )
    state = models.CharField(
        max_length=16, choices=JobState.choices, default=JobState.WAITING, db_default="waiting"
    )
    attempts = models.PositiveIntegerField(
        default=0, db_default=0, help_text="Claims so far, including the current one."
    )
    rescues = models.PositiveSmallIntegerField(
        default=0, db_default=0, help_text="Times the job was taken back from a lost worker."
    )
    next_execution_at = models.DateTimeField(default=timezone.now)
    reserved_by = models.CharField(  # noqa: DJ001 - NULL until the first claim
        max_length=255, null=True, blank=True, help_text="Worker that claimed the job last."
    )
    locked_at = models.DateTimeField(null=True, blank=True, help_text="Start of the last claim.")
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(
        null=True, blank=True, help_text="Start of the first attempt."
    )
    finished_at = models.DateTimeField(null=True, blank=True)
    errors = models.JSONField(
        null=True, blank=True, help_text="One entry per failed attempt, oldest first."
    )
    last_error = models.TextField(blank=True, default="", db_default="")
    result = models.JSONField(null=True, blank=True, help_text="JSON return value of handle().")
    chain_id = models.UUIDField(null=True, blank=True)
    chain_position = models.PositiveSmallIntegerField(null=True, blank=True)
    chain = models.JSONField(
        null=True, blank=True, help_text="The chain: its steps' job names and options."
    )

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        permissions = [
            ("retry_job", "Can retry dead and failed jobs"),
            ("cancel_job", "Can cancel jobs that have not started"),
        ]
        # The claim's partial index and the rescue index are created by migration 0002 for
        # each database (see django_gator.indexes): MySQL and MariaDB have no partial
        # indexes, and declaring them here would raise models.W037 for every MariaDB user.
        indexes = [
            # Pruning, the admin's state filter and the dashboard counts.
            models.Index(fields=["state", "finished_at"], name="gator_job_state_finished"),
            models.Index(fields=["chain_id"], name="gator_job_chain"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX),
                name="gator_job_priority_range",
            ),
            models.CheckConstraint(condition=~models.Q(queue=""), name="gator_job_queue_not_empty"),
            models.CheckConstraint(condition=~models.Q(name=""), name="gator_job_name_not_empty"),
            models.CheckConstraint(
                condition=models.Q(state__in=JobState.values), name="gator_job_state_valid"
            ),
            models.CheckConstraint(
                condition=~models.Q(state="running")
                | models.Q(reserved_by__isnull=False, locked_at__isnull=False),
                name="gator_job_running_is_reserved",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} #{self.pk} ({self.state})"

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    def refresh_state(self) -> str:
        self.refresh_from_db(fields=["state"])
        return self.state

    def retry(self) -> bool:
        """Make this dead or failed job due now (see :meth:`JobQuerySet.retry`)."""
        changed = Job.objects.filter(pk=self.pk).retry() == 1
        if changed:
            self.refresh_from_db()
        return changed

    def cancel(self) -> bool:
        """Cancel this job if it has not started."""
        changed = Job.objects.filter(pk=self.pk).cancel() == 1
        if changed:
            self.refresh_from_db()
        return changed

    @property
    def error_history(self) -> list[dict[str, Any]]:
        return list(self.errors or [])


class Worker(models.Model):
    """A running ``gator_worker`` process; its heartbeat proves it is alive."""

    id = models.CharField(primary_key=True, max_length=255)
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list, help_text="[[name, weight], ...]; empty = all.")
    concurrency = models.PositiveIntegerField()
    started_at = models.DateTimeField(default=timezone.now)
    heartbeat_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["heartbeat_at"], name="gator_worker_heartbeat")]

    def __str__(self) -> str:
        return self.id
