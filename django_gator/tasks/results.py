"""TaskResults from django-gator's rows: every TaskResult this package hands out is built
by :func:`build`, from a ``Job`` row (:func:`from_job`), from the running attempt's claim
(:func:`running`), for an enqueue whose INSERT waits for the commit (:func:`pending`) or
for an attempt that just ended (:func:`finished`)."""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.utils import timezone

from django_gator import conf
from django_gator.databases import for_queue
from django_gator.encryption import SHOWN, holds_sealed, is_sealed
from django_gator.engines import get_engine, reads
from django_gator.engines.base import loads
from django_gator.models import JobState
from django_gator.tasks.framework import TaskError, TaskResult, TaskResultDoesNotExist
from django_gator.tasks.framework import TaskResultStatus as Status

#: Our states as the framework's statuses: a job that will retry is ready again; dead and
#: cancelled jobs have failed.
STATUS: dict[str, Any] = {
    JobState.WAITING: Status.READY,
    JobState.FAILED: Status.READY,
    JobState.RUNNING: Status.RUNNING,
    JobState.SUCCEEDED: Status.SUCCESSFUL,
    JobState.DEAD: Status.FAILED,
    JobState.CANCELLED: Status.FAILED,
}


def build(
    task: Any,
    backend: str,
    result_id: str,
    status: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    enqueued_at: datetime | None = None,
    started_at: datetime | None = None,
    finished_at: datetime | None = None,
    last_attempted_at: datetime | None = None,
    errors: Iterable[Any] = (),
    worker_ids: Iterable[str] = (),
    return_value: Any = None,
) -> Any:
    """A TaskResult of ``task`` on the backend ``backend`` (its alias)."""
    result: Any = TaskResult(
        task=task,
        id=result_id,
        status=status,
        enqueued_at=enqueued_at,
        started_at=started_at,
        finished_at=finished_at,
        last_attempted_at=last_attempted_at,
        args=list(args),
        kwargs=dict(kwargs),
        backend=backend,
        errors=list(errors),
        worker_ids=list(worker_ids),
    )
    if return_value is not None:
        object.__setattr__(result, "_return_value", return_value)  # not an init field
    return result


def result_id(alias: str | None, pk: Any) -> str:
    """A result's id: the job's id, prefixed ``ALIAS:`` for a job of another job database
    than GATOR_DATABASE (GATOR_QUEUE_DATABASES), where the same id may exist too."""
    if alias is None or alias == conf.database():
        return str(pk)
    return f"{alias}:{pk}"


def from_job(task: Any, backend: str, job: Any) -> Any:
    """The TaskResult of a ``Job`` row. Data an encrypted job class sealed is shown as
    ``[encrypted]`` (it is decrypted only in the worker, see docs/encryption.md)."""
    history = list(job.errors or [])
    args, kwargs = job.args, job.kwargs
    if is_sealed(args) or holds_sealed(kwargs):
        args, kwargs = [SHOWN], {}
    return build(
        task,
        backend,
        result_id(job._state.db, job.pk),
        STATUS.get(job.state, Status.READY),
        args,
        kwargs,
        enqueued_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        last_attempted_at=job.locked_at,
        errors=[task_error(entry) for entry in history],
        worker_ids=worker_ids(history, job.attempts, job.reserved_by),
        return_value=SHOWN if is_sealed(job.result) else job.result,
    )


def running(task: Any, backend: str, job: Any, *, full: bool = True) -> Any:
    """The TaskResult of a task the calling worker thread is running (``job`` is its
    TaskJob): the arguments come from the claim, the rest from one indexed read (no ORM, on
    the hot path). Without ``full`` there is no read: times, errors and worker ids are
    left empty."""
    alias = for_queue(job.queue)
    shown_id = result_id(alias, job.job_id)
    if not full:
        return build(task, backend, shown_id, Status.RUNNING, job.args, job.kwargs)
    engine = get_engine(alias)
    row = reads.attempt_details(engine, job.job_id)
    if row is None:
        raise TaskResultDoesNotExist(shown_id)
    created_at, started_at, locked_at, raw_errors, reserved_by = row
    history = list(loads(raw_errors) or [])

    def aware(value: Any) -> datetime | None:
        return None if value is None else engine.to_dt(value)

    return build(
        task,
        backend,
        shown_id,
        Status.RUNNING,
        job.args,
        job.kwargs,
        enqueued_at=aware(created_at),
        started_at=aware(started_at),
        last_attempted_at=aware(locked_at),
        errors=[task_error(entry) for entry in history],
        worker_ids=worker_ids(history, job.attempt, reserved_by),
    )


def pending(task: Any, backend: str, job: Any) -> Any:
    """The result of an enqueue whose INSERT waits for the commit: no id yet."""
    return build(task, backend, "", Status.READY, job.args, job.kwargs)


def finished(started: Any, state: str, exception: BaseException | None, value: Any) -> Any:
    """``started`` (the running result) once the attempt ended in ``state`` for good,
    raising ``exception`` or returning ``value``."""
    errors = list(started.errors)
    if exception is not None:
        cls = type(exception)
        errors.append(
            TaskError(
                exception_class_path=f"{cls.__module__}.{cls.__qualname__}",
                traceback="".join(traceback.format_exception(exception)),
            )
        )
    return build(
        started.task,
        started.backend,
        started.id,
        STATUS[state],
        started.args,
        started.kwargs,
        enqueued_at=started.enqueued_at,
        started_at=started.started_at,
        finished_at=timezone.now(),
        last_attempted_at=started.last_attempted_at,
        errors=errors,
        worker_ids=started.worker_ids,
        return_value=value if state == JobState.SUCCEEDED else None,
    )


def worker_ids(history: list[dict[str, Any]], attempts: int, reserved_by: str | None) -> list[str]:
    """The worker of each failed attempt, then the current one's if it has not failed."""
    ids = [str(entry.get("worker", "")) for entry in history]
    if attempts > len(ids) and reserved_by:
        ids.append(reserved_by)
    return ids


def task_error(entry: dict[str, Any]) -> Any:
    """One entry of a job's error history as the framework's TaskError."""
    path = str(entry.get("class") or "Exception")
    if "." not in path:
        path = f"builtins.{path}"
    tb = entry.get("traceback", "")
    return TaskError(exception_class_path=path, traceback=SHOWN if is_sealed(tb) else str(tb))
