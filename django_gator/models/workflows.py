"""Workflows' tables: a workflow run (:class:`WorkflowRun`) and its steps
(:class:`WorkflowStep`), and the signals its wait steps take (:func:`send_signal`).
:mod:`django_gator.workflows` builds and dispatches workflows; how a step's end moves the
steps after it is :mod:`django_gator.models.settling`; what a wait step's job reads,
:mod:`django_gator.models.waits`."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import models, transaction
from django.utils import timezone

from django_gator import conf
from django_gator.dbtime import DbNow
from django_gator.exceptions import WorkflowError
from django_gator.models import awaiting
from django_gator.models.job_queries import record
from django_gator.models.jobs import Job
from django_gator.models.pruning import Prunable
from django_gator.states import JobState, StepState
from django_gator.validation import NAME_MAX_LENGTH, QUEUE_MAX_LENGTH, check_json
from django_gator.workflow_steps import STEP_NAME_MAX_LENGTH

#: on_dead values: a dead step cancels its descendants, or counts as satisfied.
ON_DEAD_CANCEL = "cancel"
ON_DEAD_CONTINUE = "continue"
ON_DEAD_CHOICES = ((ON_DEAD_CANCEL, "Cancel its descendants"), (ON_DEAD_CONTINUE, "Continue"))


class WorkflowRunQuerySet(Prunable, models.QuerySet["WorkflowRun"]):
    prune_order = ("created_at", "id")

    def finished(self, *, before: datetime | None = None) -> WorkflowRunQuerySet:
        """Workflows whose every step has ended and none of whose jobs is left (each was
        pruned, past its own retention; a dead step's job waits for an operator, so its
        workflow, which a retry may bring back, stays); with ``before``, only those
        created before it."""
        open_steps = WorkflowStep.objects.filter(
            workflow=models.OuterRef("pk"), state__in=(StepState.BLOCKED, StepState.RELEASED)
        )
        rows = self.exclude(models.Exists(open_steps)).exclude(
            models.Exists(Job.objects.filter(chain_id=models.OuterRef("pk")))
        )
        return rows if before is None else rows.filter(created_at__lt=before)


class WorkflowRun(models.Model):
    """One dispatched workflow (or chain). Its steps' jobs carry its id in ``chain_id``
    and their step's position in ``chain_position``."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    name = models.CharField(max_length=200, blank=True, default="")
    on_error = models.CharField(
        max_length=NAME_MAX_LENGTH,
        blank=True,
        default="",
        help_text="Job dispatched with (workflow id, job id) when a step ends dead.",
    )
    created_at = models.DateTimeField(default=timezone.now)
    signals = models.JSONField(
        default=dict,
        blank=True,
        null=True,  # NULL for rows that workers of the version before insert (an upgrade)
        help_text="Signals received, by name: {payload, at, by} (see WorkflowRun.signal).",
    )

    objects = WorkflowRunQuerySet.as_manager()

    class Meta:
        db_table = "django_gator_workflow"
        ordering = ["-created_at"]
        verbose_name = "workflow"
        permissions = [("signal_workflow", "Can approve or reject a workflow's wait steps")]

    def __str__(self) -> str:
        return self.name or str(self.id)

    def signal(self, name: str, payload: Any = None, *, by: str = "") -> bool:
        """Deliver the signal ``name`` to this workflow's wait step for it (see
        ``Workflow.add_wait``): its ``payload`` (JSON) becomes the wait step's result.
        True if delivered; False if a signal of that name was delivered already (the first
        one stays). Kept when the wait step is not reached yet. WorkflowError when the
        workflow waits for no signal of that name, or that wait has ended."""
        return send_signal(self._alias(), self.pk, name, payload, by=by)

    def _alias(self) -> str:
        """The database this row was read from (the job database for one built here)."""
        return self._state.db or conf.database()

    def cancel(self, *, by: str = "") -> int:
        """Cancel this workflow: its jobs not started end ``cancelled`` (running ones are
        asked to stop, see ``JobQuerySet.cancel``) and its steps not released yet end
        ``cancelled`` with who did it, so nothing after them is released even if a running
        step succeeds. Returns how many jobs and steps changed."""
        alias = self._alias()
        with transaction.atomic(using=alias):
            WorkflowRun.objects.using(alias).select_for_update().filter(pk=self.pk).first()
            jobs = Job.objects.using(alias).filter(chain_id=self.pk)
            ids = list(
                jobs.exclude(
                    state__in=(JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED)
                ).values_list("pk", flat=True)
            )
            changed = jobs.cancel()
            if ids and by:
                record(alias, ids, "cancel", by)
            changed += (
                WorkflowStep.objects.using(alias)
                .filter(workflow_id=self.pk, state=StepState.BLOCKED)
                .update(
                    state=StepState.CANCELLED,
                    reason=f"the workflow was cancelled by {by or 'an operator'}",
                )
            )
        return changed

    def retry(self, *, by: str = "") -> int:
        """Retry this workflow from its failed steps: their dead and failed jobs are due
        again (``JobQuerySet.retry``); the steps that succeeded keep their results, and
        what a dead step had cancelled waits again once it succeeds. A retried wait step
        waits again for its signal (a rejection is forgotten) until its timeout, counted
        from now. Returns how many jobs it retried."""
        alias = self._alias()
        jobs = Job.objects.using(alias).filter(
            chain_id=self.pk, state__in=(JobState.DEAD, JobState.FAILED)
        )
        ids = list(jobs.values_list("pk", flat=True))
        retried = jobs.retry(by=by or None)
        waits = WorkflowStep.objects.using(alias).filter(workflow_id=self.pk, job_id__in=ids)
        for wait in waits.exclude(wait_for="").exclude(job_id=None):
            with transaction.atomic(using=alias):
                run = WorkflowRun.objects.using(alias).select_for_update().get(pk=self.pk)
                if (run.signals or {}).get(wait.wait_for, {}).get("rejected"):
                    run.signals = {
                        k: v for k, v in (run.signals or {}).items() if k != wait.wait_for
                    }
                    run.save(using=alias, update_fields=["signals"])
                due = timezone.now() + timedelta(seconds=wait.delay or 0)
                retried_wait = Job.objects.using(alias).filter(pk=wait.job_id or 0)
                retried_wait.filter(state=JobState.WAITING).update(next_execution_at=due)
        return retried

    def wait_result(self, timeout: timedelta | float | None = None) -> dict[str, Any]:
        """Wait until every step of this workflow has ended and return ``{leaf step name:
        result}`` (a leaf: no step comes after it; a batch step's result is its members'
        results in order); raise :class:`~django_gator.exceptions.WorkflowFailed` naming
        the first step that ended dead (with ``on_dead="cancel"``) or was cancelled, with
        its job's error, or :class:`~django_gator.exceptions.ResultTimeout` after
        ``timeout`` seconds (None: no limit). Read like ``Job.wait_result``."""
        return awaiting.wait_run(self._rows(), timeout)

    async def await_result(self, timeout: timedelta | float | None = None) -> dict[str, Any]:
        """:meth:`wait_result` for async code."""
        return await awaiting.await_run(self._rows(), timeout)

    def _rows(self) -> awaiting.RunRows:
        alias = self._alias()
        steps = WorkflowStep.objects.using(alias).filter(workflow_id=self.pk)
        fatal = steps.filter(state=StepState.DEAD, on_dead=ON_DEAD_CANCEL)
        return awaiting.RunRows(self, steps, fatal, Job.objects.using(alias))

    def reject(self, name: str, *, by: str = "", note: str = "") -> bool:
        """End this workflow's wait for the signal ``name`` as rejected: the wait ends dead
        (``WaitRejected``, naming ``by``) and cancels the steps after it. Refused like
        :meth:`signal`; False if a signal of that name came already (nothing changes)."""
        entry = {"note": note} if note else None
        return send_signal(self._alias(), self.pk, name, entry, by=by, rejected=True)


class WorkflowStep(models.Model):
    """One step of a workflow: the job to run and the steps it waits for."""

    id = models.BigAutoField(primary_key=True)
    workflow = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="steps")
    position = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=NAME_MAX_LENGTH, help_text="Registered job name.")
    label = models.CharField(
        max_length=STEP_NAME_MAX_LENGTH,
        default="",
        db_default="",  # rows that workers of the version before insert (a rolling upgrade)
        blank=True,
        help_text="The step's name in its workflow (its position unless named); the key of "
        "its result in its dependents' results().",
    )
    wait_for = models.CharField(
        max_length=STEP_NAME_MAX_LENGTH,
        default="",
        db_default="",
        blank=True,
        help_text="A wait step: the name of the signal it waits for.",
    )
    delay = models.FloatField(
        null=True,
        blank=True,
        help_text="A sleep or a wait with a timeout: seconds from its release to its job's run.",
    )
    due_at = models.DateTimeField(
        null=True, blank=True, help_text="A sleep until a moment: when its job runs."
    )
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    queue = models.CharField(max_length=QUEUE_MAX_LENGTH, default="default")
    priority = models.SmallIntegerField(default=0)
    after = models.JSONField(default=list, blank=True, help_text="Positions it waits for.")
    children = models.JSONField(default=list, blank=True, help_text="Positions waiting for it.")
    waiting_on = models.PositiveIntegerField(default=0, help_text="Dependencies not satisfied yet.")
    on_dead = models.CharField(max_length=8, choices=ON_DEAD_CHOICES, default=ON_DEAD_CANCEL)
    state = models.CharField(max_length=16, choices=StepState.choices, default=StepState.BLOCKED)
    job_id = models.BigIntegerField(null=True, blank=True, help_text="Its job, once released.")
    reason = models.TextField(blank=True, default="", help_text="Why it was cancelled.")
    cancelled_by = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Position of the step whose end cancelled it."
    )
    members = models.JSONField(
        null=True,
        blank=True,
        help_text="A batch step: its members' [args, kwargs] until it is released (then []).",
    )
    batch_id = models.BigIntegerField(
        null=True, blank=True, db_index=True, help_text="A batch step: its batch, once released."
    )
    awaited = models.BooleanField(
        null=True,
        editable=False,
        help_text="Set by wait_result() on PostgreSQL: the step's end sends a NOTIFY.",
    )

    class Meta:
        db_table = "django_gator_workflow_step"
        ordering = ["workflow", "position"]
        constraints = [
            models.UniqueConstraint(
                fields=["workflow", "position"], name="gator_workflow_step_position"
            )
        ]

    def __str__(self) -> str:
        return f"step {self.position} ({self.name})"

    @property
    def is_batch(self) -> bool:
        return self.members is not None


#: Called with (alias, queues) in the transaction that made a wait's job due: wake the idle
#: workers of those queues. :mod:`django_gator.wiring` installs the engine's wakeup here
#: (this layer cannot import it).
wake_hooks: list[Callable[[str, Collection[str]], None]] = []

#: Steps in these states have ended: a signal can no longer change them.
ENDED = (StepState.SUCCEEDED, StepState.DEAD, StepState.CANCELLED)


#: Called with a signal's outcome ("delivered", "rejected", "duplicate", "refused") once
#: it is known: at the commit of its transaction, a refusal at once. The metrics count them
#: (:mod:`django_gator.wiring` installs the hook; this layer cannot import the metrics).
signal_hooks: list[Callable[[str], None]] = []


def send_signal(
    alias: str,
    run_id: uuid.UUID | str,
    name: str,
    payload: Any,
    *,
    by: str,
    rejected: bool = False,
) -> bool:
    """See WorkflowRun.signal and WorkflowRun.reject."""
    try:
        done = _deliver(alias, run_id, name, payload, by=by, rejected=rejected)
    except WorkflowError:
        for hook in signal_hooks:
            hook("refused")
        raise
    outcome = ("rejected" if rejected else "delivered") if done else "duplicate"
    for hook in signal_hooks:
        transaction.on_commit(partial(hook, outcome), using=alias, robust=True)
    return done


def _deliver(
    alias: str,
    run_id: uuid.UUID | str,
    name: str,
    payload: Any,
    *,
    by: str,
    rejected: bool,
) -> bool:
    if not isinstance(name, str) or not name:
        raise WorkflowError(f"a signal's name is a non-empty str, got {name!r}")
    check_json(payload, "payload")
    with transaction.atomic(using=alias):
        run = WorkflowRun.objects.using(alias).select_for_update().filter(pk=run_id).first()
        if run is None:
            raise WorkflowError(f"there is no workflow {run_id}")
        steps = WorkflowStep.objects.using(alias).filter(workflow=run)
        wait = steps.filter(wait_for=name).first()
        if wait is None:
            waits = sorted(steps.exclude(wait_for="").values_list("wait_for", flat=True))
            raise WorkflowError(
                f"workflow {run.pk} ({run.name or 'unnamed'}) waits for no signal named "
                f"{name!r} (its waits: {', '.join(map(repr, waits)) or 'none'})"
            )
        if name in (run.signals or {}):
            return False
        retried = (
            wait.job_id is not None
            and Job.objects.using(alias)
            .filter(pk=wait.job_id, state__in=(JobState.WAITING, JobState.RUNNING))
            .exists()
        )
        if wait.state in ENDED and not retried:
            raise WorkflowError(
                f"workflow {run.pk}: its wait for {name!r} has ended ({wait.state}); "
                "the signal changes nothing"
            )
        run.signals = {
            **(run.signals or {}),
            name: {
                "payload": payload,
                "at": timezone.now().isoformat(),
                "by": by,
                **({"rejected": True} if rejected else {}),
            },
        }
        run.save(using=alias, update_fields=["signals"])
        if wait.job_id is not None:
            waiting = Job.objects.using(alias).filter(pk=wait.job_id, state=JobState.WAITING)
            if waiting.update(next_execution_at=DbNow()):
                for hook in wake_hooks:  # idle workers claim it now, not at their next poll
                    hook(alias, [wait.queue])
    return True
