"""``AsyncResult``: a task's (or a canvas's) outcome as Celery shows it, read from the
job's row (or the workflow's): its state in Celery's names, ``get()`` that waits through
``wait_result()`` and raises the task's own error, ``ready()``, ``successful()``...

An id of digits is a job's; a UUID is a workflow's (what a chain, a group or a chord
dispatched), whose result is its last task's (a group's: the list of its tasks')."""

from __future__ import annotations

import uuid
from datetime import timedelta
from importlib import import_module
from typing import Any

from django.utils import timezone

from django_gator.celery.exceptions import TaskRevokedError, TimeoutError
from django_gator.databases import job_databases
from django_gator.exceptions import GatorError, JobFailed, ResultTimeout, WorkflowFailed
from django_gator.models import Job, JobState, WorkflowRun, WorkflowStep
from django_gator.states import StepState

PENDING, STARTED, RETRY = "PENDING", "STARTED", "RETRY"
SUCCESS, FAILURE, REVOKED = "SUCCESS", "FAILURE", "REVOKED"
#: Celery's state for each job state.
STATES = {
    JobState.WAITING: PENDING,
    JobState.RUNNING: STARTED,
    JobState.FAILED: RETRY,
    JobState.SUCCEEDED: SUCCESS,
    JobState.DEAD: FAILURE,
    JobState.CANCELLED: REVOKED,
}
READY_STATES = frozenset({SUCCESS, FAILURE, REVOKED})


class AsyncResult:
    """The outcome of the task (or canvas) of id ``id``; an unknown id is PENDING."""

    def __init__(self, id: str | int, **options: Any) -> None:
        refused = set(options) - {"task_name", "app", "backend"}
        if refused:
            raise TypeError(f"AsyncResult() got unexpected arguments: {', '.join(refused)}")
        self.id: str | None = None if id is None else str(id)
        self.task_id = self.id
        if self.id is None or self.id.isdigit():
            self._run_id: uuid.UUID | None = None
        else:
            try:
                self._run_id = uuid.UUID(self.id)
            except ValueError:
                raise ValueError(
                    f"AsyncResult({id!r}): django-gator's ids are a job's number or a "
                    "workflow's UUID"
                ) from None

    def __repr__(self) -> str:
        return f"<AsyncResult: {self.id}>"

    def __str__(self) -> str:
        return str(self.id)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, AsyncResult):
            return other.id == self.id
        return other == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    # Rows ---------------------------------------------------------------------------------

    def _job(self) -> Job | None:
        if self.id is None:
            raise GatorError(
                "this task has no id yet: it was dispatched with on_commit "
                "(GATOR_DISPATCH_ON_COMMIT), so its row is inserted when the transaction "
                "commits; keep no AsyncResult of it, or dispatch with the setting off"
            )
        for alias in job_databases():
            row = Job.objects.using(alias).filter(pk=int(self.id)).first()
            if row is not None:
                return row
        return None

    def _run(self) -> WorkflowRun | None:
        for alias in job_databases():
            row = WorkflowRun.objects.using(alias).filter(pk=str(self._run_id)).first()
            if row is not None:
                return row
        return None

    # State --------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        if self._run_id is None:
            job = self._job()
            if job is None:
                return PENDING
            return REVOKED if _expired(job) else STATES[JobState(job.state)]
        run = self._run()
        if run is None:
            return PENDING
        steps = WorkflowStep.objects.using(run._alias()).filter(workflow=run)
        if steps.filter(state__in=(StepState.BLOCKED, StepState.RELEASED)).exists():
            started = Job.objects.using(run._alias()).filter(chain_id=run.pk, state="running")
            return STARTED if started.exists() else PENDING
        try:
            run.wait_result(timeout=0)
        except WorkflowFailed as exc:
            return REVOKED if exc.state == StepState.CANCELLED and exc.error is None else FAILURE
        return SUCCESS

    status = state

    def ready(self) -> bool:
        return self.state in READY_STATES

    def successful(self) -> bool:
        return self.state == SUCCESS

    def failed(self) -> bool:
        return self.state == FAILURE

    @property
    def result(self) -> Any:
        """The return value once SUCCESS, the task's error once FAILURE or REVOKED (or
        during RETRY), else None."""
        state = self.state
        if state == SUCCESS:
            return self.get(timeout=0)
        if state in (FAILURE, REVOKED):
            return self.get(timeout=0, propagate=False)
        if state == RETRY and self._run_id is None:
            job = self._job()
            return None if job is None else task_error(job)
        return None

    info = result

    @property
    def traceback(self) -> str | None:
        job = self._job() if self._run_id is None else None
        if job is None or not job.errors:
            return None
        return str(job.errors[-1].get("traceback") or "") or None

    # Waiting ------------------------------------------------------------------------------

    def get(
        self,
        timeout: float | timedelta | None = None,
        propagate: bool = True,
        interval: float | None = None,
        **options: Any,
    ) -> Any:
        """Wait for the end and return the result; raise the task's error (with
        ``propagate``, else return it), TimeoutError after ``timeout`` seconds."""
        refused = set(options) - {"disable_sync_subtasks", "no_ack", "follow_parents"}
        if refused:
            raise TypeError(f"get() got unexpected arguments: {', '.join(sorted(refused))}")
        try:
            return self._wait(timeout)
        except ResultTimeout as exc:
            raise TimeoutError(f"task {self.id}: {exc}") from None
        except BaseException as exc:
            if propagate or isinstance(exc, TimeoutError | Job.DoesNotExist):
                raise
            return exc

    wait = get

    def _wait(self, timeout: float | timedelta | None) -> Any:
        if self._run_id is None:
            job = self._job()
            if job is None:
                raise Job.DoesNotExist(f"task {self.id} is not in the database")
            if _expired(job):
                raise TaskRevokedError(
                    f"task {job.pk} ({job.name}) was revoked: it expired at {job.expires_at}"
                )
            try:
                return job.wait_result(timeout)
            except JobFailed as exc:
                raise _error_of(job) from exc
        run = self._run()
        if run is None:
            raise WorkflowRun.DoesNotExist(f"task {self.id} is not in the database")
        try:
            leaves = run.wait_result(timeout)
        except WorkflowFailed as exc:
            jobs = Job.objects.using(run._alias())
            if exc.error is not None:
                raise _error_of(jobs.get(pk=exc.error.job_id)) from exc
            dead = jobs.filter(chain_id=run.pk, state=JobState.DEAD).order_by("pk").first()
            if dead is None:  # a batch member's job carries its batch, not the workflow
                dead = jobs.filter(batch_id__in=_batches(run), state=JobState.DEAD).first()
            if dead is None:
                raise TaskRevokedError(str(exc)) from exc
            raise _error_of(dead) from exc
        values = list(leaves.values())
        return values[0] if len(values) == 1 else values

    def revoke(self, terminate: bool = False, **options: Any) -> None:
        """Cancel the task if it has not started (a running one is asked to stop: see
        ``cancel_requested()``); ``terminate=True`` is refused."""
        if terminate or options:
            from django_gator.celery.exceptions import NotSupported

            raise NotSupported(
                "revoke(terminate=True) is not supported: running code is never killed; "
                "check self.cancel_requested() in the task instead"
            )
        if self._run_id is None:
            job = self._job()
            if job is not None:
                job.cancel()
        else:
            run = self._run()
            if run is not None:
                run.cancel(by="AsyncResult.revoke()")


def _expired(job: Job) -> bool:
    """Not started by its ``expires_at``: it never runs (the expiry sweep cancels it)."""
    return (
        job.state in (JobState.WAITING, JobState.FAILED)
        and job.expires_at is not None
        and job.expires_at <= timezone.now()
    )


def _batches(run: WorkflowRun) -> list[int]:
    steps = WorkflowStep.objects.using(run._alias()).filter(workflow=run, batch_id__isnull=False)
    return [batch for batch in steps.values_list("batch_id", flat=True) if batch is not None]


def _error_of(job: Job) -> BaseException:
    if job.state == JobState.CANCELLED:
        return TaskRevokedError(f"task {job.pk} ({job.name}) was revoked: {job.last_error}")
    return task_error(job)


def task_error(job: Job) -> BaseException:
    """The task's own error, rebuilt from the job's last error (its class and message), as
    Celery rebuilds it from a result backend; JobFailed if the class cannot be rebuilt."""
    entry = (job.errors or [{}])[-1]
    message = str(entry.get("message") or "")
    module, _, qualname = (job.error_class or "").rpartition(".")
    try:
        found: Any = import_module(module or "builtins")
        for part in qualname.split("."):
            found = getattr(found, part)
        if isinstance(found, type) and issubclass(found, BaseException):
            return found(message)
    except Exception:  # noqa: S110 - an error that cannot be rebuilt: JobFailed below
        pass
    return JobFailed(job.pk, job.name, job.state, job.error_class or "", job.last_error)
