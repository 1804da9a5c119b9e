"""A backend for Django's Tasks framework (``django.tasks`` in Django 6.0+, the
``django-tasks`` package on Django 5.2): ``@task`` functions run on django-gator.

::

    TASKS = {"default": {"BACKEND": "django_gator.tasks.GatorBackend"}}

Each task is registered under its module path (``myapp.tasks.send_report``) when the
``@task`` decorator creates it, so the worker finds it through the registry like any job;
``gator_worker`` imports the ``tasks`` module of every installed app for that. An enqueue is
a row in the ``Job`` table, written in the caller's transaction; ``get_result()`` reads it
back as a ``TaskResult``.
"""

from __future__ import annotations

import dataclasses
import inspect
import traceback
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS
from django.utils import timezone

from django_gator import conf, validation
from django_gator.exceptions import JobNotRegistered
from django_gator.queueable import Queueable, get_job_class, is_registered
from django_gator.retry import Retry

if TYPE_CHECKING:  # django-stubs describes django.tasks
    from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started

    FRAMEWORK = "django.tasks"
else:
    try:  # Django 6.0+
        from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import Task, TaskError
        from django.tasks.exceptions import InvalidTask as InvalidTaskError
        from django.tasks.exceptions import TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started

        FRAMEWORK = "django.tasks"
    except ImportError:  # Django 5.2 with the django-tasks package
        from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskError
        from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started

        FRAMEWORK = "django_tasks"

__all__ = ["FRAMEWORK", "GatorBackend", "GatorTask", "gator_backend"]

#: Our states as the framework's statuses: a job that will retry is ready again; dead and
#: cancelled jobs have failed.
STATUS = {
    "waiting": TaskResultStatus.READY,
    "failed": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "succeeded": TaskResultStatus.SUCCESSFUL,
    "dead": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GatorTask(Task):
    """The framework's Task plus django-gator's per-task policy, given to ``@task``:
    ``@task(retry=Retry(interval="exponential", max_retries=5), timeout=30)``. None takes
    the backend's default (``OPTIONS``: ``"retry"``, ``"timeout"``)."""

    retry: Retry | None = None
    timeout: float | None = None


class TaskJob(Queueable, abstract=True):
    """The job class registered for one task; the worker runs it like any job."""

    task: Any  # the Task, as the @task decorator made it
    backend_alias: str
    # The framework passes options apart from arguments: a parameter may be named "queue".
    _gator_check_dispatch_options = False

    @classmethod
    def _handler_signature(cls) -> inspect.Signature:
        signature = inspect.signature(cls.task.func)
        params = list(signature.parameters.values())
        if cls.task.takes_context:
            params = params[1:]  # the TaskContext, which the worker passes
        return signature.replace(parameters=params)

    def handle(self, *args: Any, **kwargs: Any) -> Any:
        task = type(self).task
        backend = task.get_backend()
        result = None
        listeners = _listeners(task_started, type(backend))
        if self.job_id is not None and (task.takes_context or listeners):
            full = task.takes_context or listeners == FULL
            result = backend.running_result(task, self, full=full)
            self._gator_task_result = result
            if listeners:
                task_started.send(type(backend), task_result=result)
        if task.takes_context:
            if result is None:
                raise InvalidTaskError(f"{task.module_path} takes a context but has no row")
            value = _normalize(task.call(TaskContext(task_result=result), *args, **kwargs))
        else:
            value = _normalize(task.call(*args, **kwargs))
        self._gator_return_value = value
        return value


try:
    from django.utils.json import normalize_json as _normalize  # Django 6.0+
except ImportError:
    from django_tasks.utils import normalize_json as _normalize


class GatorBackend(BaseTaskBackend):
    """Runs Django tasks with gator_worker: retries, timeouts, queues, the admin.

    ``OPTIONS``: ``"retry"`` (a :class:`~django_gator.Retry`, the default policy of tasks
    that set none), ``"timeout"`` (seconds), ``"on_commit"`` (defer each enqueue's INSERT to
    the commit of the default database's transaction; default ``GATOR_DISPATCH_ON_COMMIT``).
    """

    task_class = GatorTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.default_retry = self.options.get("retry")
        self.default_timeout = self.options.get("timeout")
        self.on_commit = self.options.get("on_commit")

    OPTION_NAMES = frozenset({"retry", "timeout", "on_commit"})

    def check(self, **kwargs: Any) -> list[Any]:
        """System checks (run by the framework's check): our options and queue names."""
        from django.conf import settings
        from django.core import checks

        errors: list[Any] = []

        def error(message: str) -> None:
            errors.append(checks.Error(f"TASKS[{self.alias!r}]: {message}", id="django_gator.E006"))

        unknown = set(self.options) - self.OPTION_NAMES
        if unknown:
            error(f"unknown OPTIONS {sorted(unknown)}; use {sorted(self.OPTION_NAMES)}")
        if self.default_retry is not None and not isinstance(self.default_retry, Retry):
            error(f"OPTIONS['retry'] must be a django_gator.Retry, got {self.default_retry!r}")
        try:
            validation.validate_timeout(self.default_timeout)
        except ValueError as exc:
            error(f"OPTIONS['timeout']: {exc}")
        for queue in sorted(self.queues):
            try:
                validation.validate_queue(queue)
            except ValueError as exc:
                error(f"QUEUES: {exc}")
        if FRAMEWORK == "django_tasks" and "django_tasks" not in settings.INSTALLED_APPS:
            error("on Django 5.2 add 'django_tasks' to INSTALLED_APPS")
        return errors

    # -- the framework's contract ------------------------------------------------------------
    def validate_task(self, task: Any) -> None:
        super().validate_task(task)
        try:
            validation.validate_queue(task.queue_name)
        except ValueError as exc:
            raise InvalidTaskError(str(exc)) from None
        retry = getattr(task, "retry", None)
        if retry is not None and not isinstance(retry, Retry):
            raise InvalidTaskError(f"retry must be a django_gator.Retry or None, got {retry!r}")
        try:
            validation.validate_timeout(getattr(task, "timeout", None))
        except ValueError as exc:
            raise InvalidTaskError(str(exc)) from None
        self.job_class(task)

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        from django_gator.dispatch import enqueue

        self.validate_task(task)
        job_class = self.job_class(task)
        on_commit = self.on_commit if self.on_commit is not None else None
        [job] = enqueue(
            job_class,
            [(list(args), dict(kwargs))],
            at=task.run_after,
            queue=task.queue_name,
            priority=task.priority,
            on_commit=DEFAULT_DB_ALIAS if on_commit else on_commit,
        )
        result = self._result(task, job) if job.pk is not None else self._pending(task, job)
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        from django_gator.models import Job

        try:
            job = Job.objects.using(conf.database()).get(pk=int(result_id))
        except (Job.DoesNotExist, ValueError, TypeError):
            raise TaskResultDoesNotExist(result_id) from None
        try:
            job_class = get_job_class(job.name)
        except JobNotRegistered:
            raise TaskResultDoesNotExist(
                f"{result_id}: its task {job.name!r} is not known to this process"
            ) from None
        if not issubclass(job_class, TaskJob):
            raise TaskResultDoesNotExist(f"{result_id} is a job ({job.name}), not a task")
        return self._result(job_class.task, job)

    # -- mapping -------------------------------------------------------------------------
    def job_class(self, task: Any) -> type[TaskJob]:
        """The registered job class of ``task`` (registered on first use)."""
        name = task.module_path
        try:
            existing = get_job_class(name)
        except JobNotRegistered:
            existing = None
        if (
            existing is not None
            and issubclass(existing, TaskJob)
            and existing.task.func is task.func
            and is_registered(existing)
        ):
            return existing
        retry = getattr(task, "retry", None) or self.default_retry
        timeout = getattr(task, "timeout", None) or self.default_timeout
        attrs = {
            "name": name,
            "task": task,
            "backend_alias": self.alias,
            "retry": retry,
            "timeout": timeout,
            "queue": task.queue_name,
            "priority": task.priority,
            "__module__": task.func.__module__,
            "__qualname__": f"TaskJob[{task.func.__qualname__}]",
        }
        job_class = type(f"TaskJob_{task.func.__name__}", (TaskJob,), attrs)
        return job_class

    def _result(self, task: Any, job: Any) -> Any:
        errors = list(job.errors or [])
        worker_ids = [str(e.get("worker", "")) for e in errors]
        if job.attempts > len(worker_ids) and job.reserved_by:
            worker_ids.append(job.reserved_by)
        result: Any = TaskResult(
            task=task,
            id=str(job.pk),
            status=STATUS.get(job.state, TaskResultStatus.READY),
            enqueued_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            last_attempted_at=job.locked_at,
            args=list(job.args),
            kwargs=dict(job.kwargs),
            backend=self.alias,
            errors=[_task_error(e) for e in errors],
            worker_ids=worker_ids,
        )
        object.__setattr__(result, "_return_value", job.result)
        return result

    def running_result(self, task: Any, job: TaskJob, *, full: bool = True) -> Any:
        """The TaskResult of a task the calling worker thread is running: the arguments
        come from the claim, the rest from one indexed read (no ORM, on the hot path).
        Without ``full`` there is no read: times, errors and worker ids are left empty."""
        from django_gator.engines import get_engine
        from django_gator.engines.base import loads

        if not full:
            status = TaskResultStatus.RUNNING
            return self._bare_result(task, str(job.job_id), status, job.args, job.kwargs)
        engine = get_engine(conf.database())
        with engine.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT created_at, started_at, locked_at, errors, reserved_by "
                f"FROM {engine.job_table} WHERE id = %s",
                [job.job_id],
            )
            row = cursor.fetchone()
        if row is None:
            raise TaskResultDoesNotExist(str(job.job_id))
        created_at, started_at, locked_at, raw_errors, reserved_by = row
        errors = list(loads(raw_errors) or [])
        worker_ids = [str(e.get("worker", "")) for e in errors]
        if job.attempt > len(worker_ids) and reserved_by:
            worker_ids.append(reserved_by)
        return TaskResult(
            task=task,
            id=str(job.job_id),
            status=TaskResultStatus.RUNNING,
            enqueued_at=_aware(engine, created_at),
            started_at=_aware(engine, started_at),
            finished_at=None,
            last_attempted_at=_aware(engine, locked_at),
            args=job.args,
            kwargs=job.kwargs,
            backend=self.alias,
            errors=[_task_error(e) for e in errors],
            worker_ids=worker_ids,
        )

    def _pending(self, task: Any, job: Any) -> Any:
        """The result of an enqueue whose INSERT waits for the commit: no id yet."""
        return self._bare_result(task, "", TaskResultStatus.READY, job.args, job.kwargs)

    def _bare_result(self, task: Any, result_id: str, status: Any, args: Any, kwargs: Any) -> Any:
        """A TaskResult with no times, errors or workers."""
        return TaskResult(
            task=task,
            id=result_id,
            status=status,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )


def _aware(engine: Any, value: Any) -> Any:
    return None if value is None else engine.to_dt(value)


def _task_error(entry: dict[str, Any]) -> Any:
    path = str(entry.get("class") or "Exception")
    if "." not in path:
        path = f"builtins.{path}"
    return TaskError(exception_class_path=path, traceback=str(entry.get("traceback", "")))


def _on_job_finished(sender: Any, job: Any, state: str, exception: Any, **kwargs: Any) -> None:
    """task_finished for a task whose attempt ended for good (not one that will retry)."""
    if not isinstance(job, TaskJob) or state == "failed":
        return
    task = type(job).task
    backend = task.get_backend()
    listeners = _listeners(task_finished, type(backend))
    if not listeners:
        return
    started = getattr(job, "_gator_task_result", None)
    if started is None or (listeners == FULL and started.enqueued_at is None):
        started = backend.running_result(task, job, full=listeners == FULL)
    changes: dict[str, Any] = {
        "status": STATUS[state],
        "finished_at": timezone.now(),
    }
    if exception is not None:
        cls = type(exception)
        changes["errors"] = [
            *started.errors,
            TaskError(
                exception_class_path=f"{cls.__module__}.{cls.__qualname__}",
                traceback="".join(traceback.format_exception(exception)),
            ),
        ]
    result = dataclasses.replace(started, **changes)
    if state == "succeeded":
        object.__setattr__(result, "_return_value", getattr(job, "_gator_return_value", None))
    task_finished.send(type(backend), task_result=result)


#: Where the framework's own receivers live: they log a task's id, path and status.
_FRAMEWORK_RECEIVERS = ("django.tasks.signals", "django_tasks.signals")
#: _listeners(): nobody; only the framework's logging receivers; someone else.
NONE, LOGGING, FULL = 0, 1, 2


def _listeners(signal: Any, sender: type) -> int:
    """Who listens to ``signal``. The framework's own receivers only log the result's id,
    task path and status, which the worker knows without reading the row; anyone else gets
    a TaskResult with every field, which costs a database read per task."""
    if not signal.has_listeners(sender):
        return NONE
    try:
        sync_receivers, async_receivers = signal._live_receivers(sender)
    except (AttributeError, TypeError, ValueError):
        return FULL  # another Django version: give receivers everything
    only_logging = not async_receivers and all(
        getattr(r, "__module__", "") in _FRAMEWORK_RECEIVERS for r in sync_receivers
    )
    return LOGGING if only_logging else FULL


def gator_backend() -> GatorBackend:
    """The first backend of the TASKS setting that is a GatorBackend."""
    from django.conf import settings

    for alias in getattr(settings, "TASKS", {}) or {}:
        backend = task_backends[alias]
        if isinstance(backend, GatorBackend):
            return backend
    raise LookupError("no TASKS backend is django_gator.tasks.GatorBackend")


def connect_signals() -> None:
    from django_gator.signals import job_finished

    job_finished.connect(_on_job_finished, dispatch_uid="django_gator.tasks.finished")
