"""The jobs table: the ``Job`` model, its indexes, and the domain verbs the admin and the
management commands share (see the package docstring for where the hot paths live)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import IntegrityError, models, transaction
from django.utils import timezone

from django_gator import conf
from django_gator.dbtime import DbNow
from django_gator.jsonsql import JsonAppend
from django_gator.limits import KEY_MAX_LENGTH
from django_gator.models import membership
from django_gator.models.pruning import Pruned, delete_in_batches
from django_gator.models.queues import Queue
from django_gator.states import FINAL_STATES, READY_STATES, JobState
from django_gator.validation import (
    NAME_MAX_LENGTH,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUEUE_MAX_LENGTH,
    UNIQUE_KEY_MAX_LENGTH,
    short_repr,
)

#: An exception class as the worker records it: ``ValueError``, ``myapp.jobs.Boom``.
ERROR_CLASS_RE = re.compile(r"[^\s:]+")


def exception_class_name(value: object) -> str:
    """``value`` if it can name an exception class as the worker records it (no spaces, no
    colon); else ValueError naming it."""
    if not isinstance(value, str) or not ERROR_CLASS_RE.fullmatch(value):
        raise ValueError(
            f"{short_repr(value)} is not an exception class name (such as ValueError or "
            "myapp.jobs.PaymentDeclined)"
        )
    return value


def record(alias: str | None, ids: list[int], action: str, by: str, **details: Any) -> None:
    """Append an operator action to the audit trail of the jobs ``ids``."""
    entry = {"at": timezone.now().isoformat(), "by": by, "action": action}
    entry.update({k: v for k, v in details.items() if v is not None})
    document = json.dumps(entry)
    jobs = Job.objects.using(alias or conf.database())
    for start in range(0, len(ids), 1000):
        jobs.filter(pk__in=ids[start : start + 1000]).update(audit=JsonAppend("audit", document))


#: Called with (alias, job ids) in the transaction of an operator's cancel() or discard(),
#: for rows it may have ended ``cancelled``: :mod:`django_gator.wiring` installs the
#: settling of workflow steps here (models.workflows imports this module, so this one
#: cannot import it).
cancel_hooks: list[Callable[[str, list[int]], None]] = []


def _cancelled(alias: str, ids: list[int]) -> None:
    for hook in cancel_hooks:
        hook(alias, ids)


def _reopen_batches(jobs: JobQuerySet) -> None:
    """Dead members about to be retried: their completed batches start a new generation."""
    membership.reopen(jobs.db, membership.batches_of(jobs, (JobState.DEAD,)))


#: Final states, as values.
FINAL = tuple(state.value for state in FINAL_STATES)


def _in_an_open_batch() -> models.Exists:
    """The job is a member of a batch that has not completed (yet, or again)."""
    # Batch through the app registry: its module imports this one.
    batch = Job._meta.apps.get_model("django_gator", "Batch")
    return models.Exists(
        batch.objects.filter(
            pk=models.OuterRef("batch_id"), completed_generation__lt=models.F("generation")
        )
    )


class JobQuerySet(models.QuerySet["Job"]):
    def ready(self) -> JobQuerySet:
        """Jobs a worker may claim now: due, and not in a paused queue."""
        return self.filter(state__in=READY_STATES, next_execution_at__lte=DbNow()).exclude(
            queue__in=Queue.objects.using(self.db).paused_names()
        )

    def scheduled(self) -> JobQuerySet:
        return self.filter(state__in=READY_STATES, next_execution_at__gt=DbNow())

    def running(self) -> JobQuerySet:
        return self.filter(state=JobState.RUNNING)

    def dead(self) -> JobQuerySet:
        return self.filter(state=JobState.DEAD)

    def finished(self, *, before: datetime | None = None) -> JobQuerySet:
        """Succeeded, dead and cancelled jobs; with ``before``, those whose ``finished_at``
        is older (a job with no ``finished_at`` is never older)."""
        jobs = self.filter(state__in=FINAL_STATES)
        return jobs if before is None else jobs.filter(finished_at__lt=before)

    def raised(self, *classes: str, exact: bool = False) -> JobQuerySet:
        """Jobs whose last failed attempt raised one of ``classes``, each the exception class
        as recorded (``myapp.jobs.PaymentDeclined``) or, unless ``exact``, its last dotted
        parts (``PaymentDeclined``, ``jobs.PaymentDeclined``); case matters. The
        ``error_class`` column says it; a row that failed before that column existed
        (migration 0005 added it, NULL in older rows) says it with the class at the start of
        its ``last_error`` (``myapp.jobs.PaymentDeclined: card expired``). No classes: no
        jobs. ValueError names a class that cannot be one (empty, with a space or a colon).

        ``gator_retry --error`` matches loosely; the admin's dead-job groups, each one
        recorded class, match ``exact``."""
        if not classes:
            return self.none()
        names = "|".join(re.escape(exception_class_name(c)) for c in classes)
        prefix = "" if exact else r"(.*\.)?"
        last_error_prefix = "" if exact else r"([^:]*\.)?"
        return self.filter(
            models.Q(error_class__regex=rf"^{prefix}({names})$")
            | models.Q(
                error_class__isnull=True,
                last_error__regex=rf"^\s*{last_error_prefix}({names})\s*(:|$)",
            )
        )

    def prunable(self) -> JobQuerySet:
        """The jobs of this queryset that :meth:`prune` deletes: the finished ones, but
        members of a batch that has not completed."""
        return self.finished().filter(~_in_an_open_batch())

    def prune(
        self,
        *,
        batch_size: int = 10_000,
        max_batches: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Pruned:
        """Delete the finished jobs of this queryset (never a waiting, running or failed
        one), the oldest ``finished_at`` first, ``batch_size`` rows per short transaction so
        workers are never held up; a row that changed between the read of a batch and its
        delete (a retried job) stays. ``progress`` is called with each batch's count. Stops
        when a batch comes back short (nothing left) or after ``max_batches`` batches.

        Members of a batch that has not completed are kept until it completes: whether
        its ``on_success`` runs is decided then, from its members' rows (a cancelled or
        dead member deleted before would let it run)."""
        # The (state, finished_at) index in its own order: each batch reads only its rows,
        # however many are left.
        return delete_in_batches(
            self.prunable(),
            ("finished_at", "id"),
            batch_size=batch_size,
            max_batches=max_batches,
            progress=progress,
        )

    def stale(self, *, before: datetime) -> JobQuerySet:
        """Running jobs whose claim is older than ``before``."""
        return self.running().filter(locked_at__lt=before)

    def retry(self, *, by: str | None = None, queue: str | None = None) -> int:
        """Make dead and failed jobs due now; returns how many rows changed.

        Attempts and the error history are kept: the next claim counts on from them. A
        unique job whose key is held by another waiting, failed or running job stays where
        it is (two active jobs with one key would break the uniqueness). ``queue`` moves the
        jobs onto another queue; ``by`` (who asked) is recorded in each job's audit trail.
        """
        retryable = self.filter(state__in=(JobState.DEAD, JobState.FAILED))
        changes: dict[str, Any] = {
            "state": JobState.WAITING,
            "next_execution_at": DbNow(),
            "finished_at": None,
            "cancel_requested": False,
        }
        if queue is not None:
            changes["queue"] = queue
        ids = list(retryable.values_list("pk", flat=True))
        changed: list[int] = []
        for start in range(0, len(ids), 5000):
            chunk = ids[start : start + 5000]
            try:
                with transaction.atomic(using=retryable.db):
                    _reopen_batches(retryable.filter(pk__in=chunk))
                    retryable.filter(pk__in=chunk).update(**changes)
                    changed += chunk
                continue
            except IntegrityError:
                pass
            # Some unique keys are taken: row by row, skipping those.
            for pk in chunk:
                try:
                    with transaction.atomic(using=retryable.db):
                        _reopen_batches(retryable.filter(pk=pk))
                        if retryable.filter(pk=pk).update(**changes):
                            changed.append(pk)
                except IntegrityError:
                    continue
        if changed and by is not None:
            record(self.db, changed, "retry", by, queue=queue)
        return len(changed)

    def discard(self, *, by: str) -> int:
        """End dead and failed jobs ``cancelled`` without running them again, recording
        ``by`` in their audit trail; returns how many rows changed."""
        discardable = self.filter(state__in=(JobState.DEAD, JobState.FAILED))
        with transaction.atomic(using=self.db):
            ids = list(discardable.select_for_update().values_list("pk", flat=True))
            discardable.filter(pk__in=ids).update(state=JobState.CANCELLED, finished_at=DbNow())
            membership.settle(self.db, membership.batches_of(self.filter(pk__in=ids), FINAL))
            if ids:
                record(self.db, ids, "discard", by)
                _cancelled(self.db, ids)
        return len(ids)

    def cancel(self) -> int:
        """Cancel jobs: waiting and failed ones end ``cancelled`` at once; running ones get
        ``cancel_requested`` (the job sees it through ``self.cancel_requested()``, and ends
        ``cancelled`` if it stops with an error or its worker is lost). Finished rows are left
        alone. Returns how many rows changed; one UPDATE, so no row slips between the two.
        """
        ready = models.Q(state__in=READY_STATES)
        with transaction.atomic(using=self.db):
            # Workflow steps among them: their descendants are cancelled in this transaction.
            steps = list(
                self.filter(ready, chain_id__isnull=False)
                .select_for_update()
                .values_list("pk", flat=True)
            )
            # Members of a batch: it is settled in the same transaction.
            batches = membership.batches_of(self, READY_STATES)
            changed = self._cancel(ready)
            if steps:
                _cancelled(self.db, steps)
            membership.settle(self.db, batches)
        return changed

    def _cancel(self, ready: models.Q) -> int:
        return self.filter(
            models.Q(state__in=READY_STATES) | models.Q(state=JobState.RUNNING)
        ).update(
            # state last: MySQL evaluates SET left to right, later assignments seeing the
            # new values of earlier ones.
            finished_at=models.Case(
                models.When(ready, then=DbNow()), default=models.F("finished_at")
            ),
            cancel_requested=models.Case(
                models.When(state=JobState.RUNNING, then=models.Value(True)),
                default=models.F("cancel_requested"),
            ),
            state=models.Case(
                models.When(ready, then=models.Value(JobState.CANCELLED.value)),
                default=models.F("state"),
            ),
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
    concurrency_key = models.CharField(  # noqa: DJ001 - NULL means "no class limits"
        max_length=KEY_MAX_LENGTH,
        null=True,
        blank=True,
        help_text="Set on jobs of a class with concurrency_limit or rate_limit: the key they "
        "are counted under (empty: the class as a whole).",
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

    def retry(self) -> bool:
        """Make this dead or failed job due now (see :meth:`JobQuerySet.retry`)."""
        changed = Job.objects.filter(pk=self.pk).retry() == 1
        if changed:
            self.refresh_from_db()
        return changed

    def cancel(self) -> bool:
        """Cancel this job if it has not started; ask a running one to stop (see
        :meth:`JobQuerySet.cancel`). False if the job had already finished."""
        changed = Job.objects.filter(pk=self.pk).cancel() == 1
        if changed:
            self.refresh_from_db()
        return changed

    @property
    def error_history(self) -> list[dict[str, Any]]:
        return list(self.errors or [])
