"""What the jobs table is asked: :class:`JobQuerySet` (``Job.objects``), its selections
(ready, dead, raised, prunable, ...) and the operator's verbs (retry, discard, cancel),
which write the audit trail (:func:`record`) and call the cancel hooks."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.db import IntegrityError, models, transaction
from django.utils import timezone

from django_gator import conf
from django_gator.databases import for_queue
from django_gator.dbtime import DbNow
from django_gator.exceptions import CrossDatabase
from django_gator.jsonsql import JsonAppend
from django_gator.models import membership
from django_gator.models.pruning import Pruned, delete_in_batches
from django_gator.models.queues import Queue
from django_gator.states import FINAL_STATES, READY_STATES, JobState
from django_gator.validation import short_repr

if TYPE_CHECKING:
    # The QuerySet's type argument (a string: jobs.py imports this module).
    from django_gator.models.jobs import Job  # noqa: F401

__all__ = [
    "ERROR_CLASS_RE",
    "JobQuerySet",
    "Pruned",
    "cancel_hooks",
    "exception_class_name",
    "record",
]


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


def _stays_in(alias: str, queue: str) -> None:
    """CrossDatabase when jobs of the database ``alias`` would move to ``queue``, whose jobs
    live in another (GATOR_QUEUE_DATABASES): a job cannot leave its database."""
    if not conf.get("GATOR_QUEUE_DATABASES"):
        return
    target = for_queue(queue)
    if target != alias:
        raise CrossDatabase(
            f"queue {queue!r} is routed to the job database {target!r} (GATOR_QUEUE_DATABASES),"
            f" but these jobs live in {alias!r}: a job cannot move to another database; "
            "dispatch it again onto that queue instead"
        )


def record(alias: str | None, ids: list[int], action: str, by: str, **details: Any) -> None:
    """Append an operator action to the audit trail of the jobs ``ids``."""
    entry = {"at": timezone.now().isoformat(), "by": by, "action": action}
    entry.update({k: v for k, v in details.items() if v is not None})
    document = json.dumps(entry)
    # Job through the app registry: its module imports this one.
    job = apps.get_model("django_gator", "Job")
    jobs = job.objects.using(alias or conf.database())
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
    # Batch through the app registry: its module imports this one's.
    batch = apps.get_model("django_gator", "Batch")
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
            _stays_in(self.db, queue)
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
