"""The jobs table: the ``Job`` model and its indexes. Its queries and the domain verbs the
admin and the management commands share are :class:`~django_gator.models.job_queries.JobQuerySet`
(see the package docstring for where the hot paths live)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import models
from django.utils import timezone

from django_gator.databases import for_queue
from django_gator.limits import KEY_MAX_LENGTH
from django_gator.models import awaiting
from django_gator.models.job_queries import JobQuerySet
from django_gator.redaction import job_secret_values, mask_text
from django_gator.states import FINAL_STATES, JobState
from django_gator.validation import (
    NAME_MAX_LENGTH,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUEUE_MAX_LENGTH,
    UNIQUE_KEY_MAX_LENGTH,
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
        max_length=16,
        choices=JobState.choices,
        default=JobState.WAITING,
        db_default=JobState.WAITING.value,
    )
    attempts = models.PositiveIntegerField(
        default=0, db_default=0, help_text="Claims so far, including the current one."
    )
    rescues = models.PositiveSmallIntegerField(
        default=0, db_default=0, help_text="Times the job was taken back from a lost worker."
    )
    snoozes = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="Times handle() raised Snooze: back to waiting, no attempt counted.",
    )
    handbacks = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="Times a stopping worker gave the job back to waiting while it ran.",
    )
    outages = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="Attempts cut short by a lost database connection, retried uncharged.",
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
    error_class = models.CharField(  # noqa: DJ001 - NULL until the first failure
        max_length=255,
        null=True,
        blank=True,
        help_text="Exception class of the last failed attempt (groups the dead-job screen).",
    )
    audit = models.JSONField(
        null=True,
        blank=True,
        help_text="Operator actions on this job (retries, edits, discards): who, when, what.",
    )
    result = models.JSONField(null=True, blank=True, help_text="JSON return value of handle().")
    chain_id = models.UUIDField(null=True, blank=True)
    chain_position = models.PositiveSmallIntegerField(null=True, blank=True)
    chain = models.JSONField(
        null=True, blank=True, help_text="The chain: its steps' job names and options."
    )
    unique_key = models.CharField(  # noqa: DJ001 - NULL means "not unique"
        max_length=UNIQUE_KEY_MAX_LENGTH,
        null=True,
        blank=True,
        help_text="At most one waiting, failed or running job per job name and key.",
    )
    dedupe_key = models.CharField(  # noqa: DJ001 - NULL: no window (see django_gator.dedupe)
        max_length=UNIQUE_KEY_MAX_LENGTH,
        null=True,
        blank=True,
        help_text="The key of a class with unique_for, debounce or throttle: its window "
        "(after the job finished, or before it starts) is counted under it.",
    )
    expires_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Not started by then: never runs (ends cancelled, reason 'expired').",
    )
    concurrency_key = models.CharField(  # noqa: DJ001 - NULL means "no class limits"
        max_length=KEY_MAX_LENGTH,
        null=True,
        blank=True,
        help_text="Set on jobs of a class with concurrency_limit or rate_limit: the key they "
        "are counted under (empty: the class as a whole).",
    )
    fairness_key = models.CharField(  # noqa: DJ001 - NULL: not in a fair queue
        max_length=KEY_MAX_LENGTH,
        null=True,
        blank=True,
        help_text="Set on jobs of a fair queue (GATOR_FAIRNESS): the tenant their claims are "
        "shared between (empty: the queue's keyless tenant).",
    )
    fair_order = models.FloatField(
        null=True,
        blank=True,
        editable=False,
        help_text="A fair queue's stamp: its claims take jobs by priority, then this.",
    )
    cancel_requested = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Cancellation asked for while running; the job may stop early.",
    )
    batch_id = models.BigIntegerField(
        null=True, blank=True, help_text="The batch this job is a member of (see Batch)."
    )
    # Precise blame for crashes: a job rescued from a lost worker becomes a suspect and
    # runs alone in its worker until it ends; only crashes while it ran alone are its own.
    suspect = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Taken back from a lost worker: runs alone until it ends.",
    )
    isolated = models.BooleanField(
        default=False,
        db_default=False,
        help_text="This attempt runs alone in its worker (a suspect's test run).",
    )
    crashes = models.PositiveSmallIntegerField(
        default=0,
        db_default=0,
        help_text="Workers lost while this job ran alone in them: crashes it caused.",
    )
    trace_context = models.JSONField(
        null=True,
        blank=True,
        help_text="OpenTelemetry context of the dispatch (traceparent), continued by each run.",
    )
    progress = models.JSONField(
        null=True,
        blank=True,
        help_text="The last progress() of a run: done, total, note (and rate, at).",
    )
    checkpoint_data = models.JSONField(
        null=True,
        blank=True,
        help_text="The last checkpoint() written: the next attempt resumes from it.",
    )
    # Named so that the model's logs() reads them: job.logs() masks the redacted values.
    captured_logs = models.JSONField(
        null=True,
        blank=True,
        db_column="logs",
        help_text="Log records each attempt emitted (see GATOR_JOB_LOG_LEVEL), per attempt.",
    )
    awaited = models.BooleanField(
        null=True,
        editable=False,
        help_text="Set by wait_result() on PostgreSQL: the job's end sends a NOTIFY.",
    )

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        permissions = [
            ("retry_job", "Can retry dead and failed jobs"),
            ("cancel_job", "Can cancel jobs that have not started"),
            ("view_encrypted", "Can see the decrypted data of encrypted jobs"),
        ]
        # The claim's partial index and the rescue index are created by migration 0002 for
        # each database (see django_gator.indexes): MySQL and MariaDB have no partial
        # indexes, and declaring them here would raise models.W037 for every MariaDB user.
        indexes = [
            # Pruning, the admin's state filter and the dashboard counts.
            models.Index(fields=["state", "finished_at"], name="gator_job_state_finished"),
            models.Index(fields=["chain_id"], name="gator_job_chain"),
        ]
        # The dead-job screen's partial index (dead and failed rows only) is created by
        # migration 0005 on PostgreSQL and SQLite, and the index of batch members by state
        # (partial there: batch rows only; a full one on MySQL/MariaDB) by 0012 and 0017;
        # see django_gator.indexes.
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
                condition=~models.Q(state=JobState.RUNNING.value)
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

    def _database(self) -> str:
        """The database this row was read from (or saved to): a routed job's own (see
        GATOR_QUEUE_DATABASES), else that of its queue."""
        return self._state.db or for_queue(self.queue)

    def retry(self) -> bool:
        """Make this dead or failed job due now (see :meth:`JobQuerySet.retry`)."""
        changed = Job.objects.using(self._database()).filter(pk=self.pk).retry() == 1
        if changed:
            self.refresh_from_db()
        return changed

    def cancel(self) -> bool:
        """Cancel this job if it has not started; ask a running one to stop (see
        :meth:`JobQuerySet.cancel`). False if the job had already finished."""
        changed = Job.objects.using(self._database()).filter(pk=self.pk).cancel() == 1
        if changed:
            self.refresh_from_db()
        return changed

    def wait_result(self, timeout: timedelta | float | None = None) -> Any:
        """Wait until this job ends and return what its ``handle()`` returned; raise
        :class:`~django_gator.exceptions.JobFailed` if it ended ``dead`` or ``cancelled``
        (its last error attached), :class:`~django_gator.exceptions.ResultTimeout` if it
        has not ended after ``timeout`` seconds (None: no limit). A failed attempt that
        will be retried is not an end. Reads the row with a backoff of 5 to 50 ms (see
        :mod:`django_gator.models.awaiting`); refused inside ``transaction.atomic()``."""
        return awaiting.wait_job(self, timeout)

    async def await_result(self, timeout: timedelta | float | None = None) -> Any:
        """:meth:`wait_result` for async code (the reads go through ``sync_to_async``, the
        pauses are ``asyncio.sleep``: no thread is held while the job runs)."""
        return await awaiting.await_job(self, timeout)

    @property
    def error_history(self) -> list[dict[str, Any]]:
        return list(self.errors or [])

    def logs(self) -> list[dict[str, Any]]:
        """The log lines each attempt captured (see ``log_level``), oldest attempt first:
        dicts with ``attempt``, ``worker``, ``at``, ``level``, ``lines`` (the newest lines
        kept, oldest first) and ``dropped`` (older lines not kept). The job's redacted
        values are masked in the lines, as in its error messages."""
        secrets = job_secret_values(self.name, self.args, self.kwargs, self.audit)
        entries = []
        for entry in self.captured_logs or []:
            lines = [mask_text(str(line), secrets) for line in entry.get("lines") or []]
            entries.append({**entry, "lines": lines})
        return entries
