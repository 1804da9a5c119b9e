"""The backend: ``@task`` functions become registered job classes, an enqueue is a
``Job`` row, and a result is read back from it."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core import checks
from django.db import DEFAULT_DB_ALIAS

from django_gator import conf, replicas, validation
from django_gator.databases import job_databases
from django_gator.dispatch import enqueue
from django_gator.exceptions import JobNotRegistered
from django_gator.models import Job, JobState
from django_gator.queueable import Queueable, get_job_class, is_registered
from django_gator.retry import Retry
from django_gator.signals import job_finished
from django_gator.tasks import results
from django_gator.tasks.framework import (
    FRAMEWORK,
    BaseTaskBackend,
    InvalidTaskError,
    Task,
    TaskContext,
    TaskResultDoesNotExist,
    normalize_json,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_gator.tasks.listeners import FULL, listeners


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
    _options_apart_from_arguments = True

    @classmethod
    def _handler_signature(cls) -> inspect.Signature:
        signature = inspect.signature(cls.task.func)
        params = list(signature.parameters.values())
        if cls.task.takes_context:
            params = params[1:]  # the TaskContext, which the worker passes
        return signature.replace(parameters=params)

    @classmethod
    def _handler_is_async(cls) -> bool:
        return inspect.iscoroutinefunction(cls.task.func)

    def handle(self, *args: Any, **kwargs: Any) -> Any:
        if type(self).traits.is_async:
            return self._ahandle(*args, **kwargs)  # the worker awaits it on its loop
        task = type(self).task
        result = self._started()
        if task.takes_context:
            if result is None:
                raise InvalidTaskError(f"{task.module_path} takes a context but has no row")
            value = normalize_json(task.call(TaskContext(task_result=result), *args, **kwargs))
        else:
            value = normalize_json(task.call(*args, **kwargs))
        self._gator_return_value = value
        return value

    async def _ahandle(self, *args: Any, **kwargs: Any) -> Any:
        """handle() of an ``async def`` task: the same steps, its database reads and the
        signals in a thread (sync_to_async), the task awaited."""
        task = type(self).task
        result = await sync_to_async(self._started)()
        if task.takes_context:
            if result is None:
                raise InvalidTaskError(f"{task.module_path} takes a context but has no row")
            value = await task.acall(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = await task.acall(*args, **kwargs)
        self._gator_return_value = normalize_json(value)
        return self._gator_return_value

    def _started(self) -> Any:
        """Read the running TaskResult when the task or a task_started listener needs it,
        and send task_started; the TaskResult or None."""
        task = type(self).task
        backend = task.get_backend()
        started = listeners(task_started, type(backend))
        if self.job_id is None or not (task.takes_context or started):
            return None
        result = backend.running_result(task, self, full=task.takes_context or started == FULL)
        self._gator_task_result = result
        if started:
            task_started.send(type(backend), task_result=result)
        return result


class GatorBackend(BaseTaskBackend):
    """Runs Django tasks with gator_worker: retries, timeouts, queues, the admin.

    ``OPTIONS``: ``"retry"`` (a :class:`~django_gator.Retry`, the default policy of tasks
    that set none), ``"timeout"`` (seconds), ``"on_commit"`` (defer each enqueue's INSERT to
    the commit of the default database's transaction; default ``GATOR_DISPATCH_ON_COMMIT``),
    ``"results_from_replica"`` (``get_result`` reads the ``GATOR_READ_DATABASE`` replica
    when it answers and lags within its bound, and the primary for a result it does not
    have yet; default False: the primary).
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
        self.results_from_replica = self.options.get("results_from_replica", False)

    OPTION_NAMES = frozenset({"retry", "timeout", "on_commit", "results_from_replica"})

    def check(self, **kwargs: Any) -> list[Any]:
        """System checks (run by the framework's check): our options and queue names."""
        errors: list[Any] = []

        def error(message: str) -> None:
            errors.append(checks.Error(f"TASKS[{self.alias!r}]: {message}", id="django_gator.E006"))

        unknown = set(self.options) - self.OPTION_NAMES
        if unknown:
            error(f"unknown OPTIONS {sorted(unknown)}; use {sorted(self.OPTION_NAMES)}")
        if self.default_retry is not None and not isinstance(self.default_retry, Retry):
            error(f"OPTIONS['retry'] must be a django_gator.Retry, got {self.default_retry!r}")
        if not isinstance(self.results_from_replica, bool):
            error(
                "OPTIONS['results_from_replica'] must be True or False, "
                f"got {self.results_from_replica!r}"
            )
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
        self.validate_task(task)
        job_class = self.job_class(task)
        [job] = enqueue(
            job_class,
            [(list(args), dict(kwargs))],
            at=task.run_after,
            queue=task.queue_name,
            priority=task.priority,
            on_commit=DEFAULT_DB_ALIAS if self.on_commit else self.on_commit,
        )
        if job.pk is None:
            result = results.pending(task, self.alias, job)
        else:
            result = results.from_job(task, self.alias, job)
        task_enqueued.send(type(self), task_result=result)
        return result

    async def aenqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """enqueue() from async code: validated on the event loop, the INSERT (and the
        task_enqueued signal) in the caller's thread (see dispatch.aenqueue)."""
        self.validate_task(task)
        job_class = self.job_class(task)
        job_class.check_arguments(list(args), dict(kwargs))
        return await sync_to_async(self.enqueue, thread_sensitive=True)(task, args, kwargs)

    def get_result(self, result_id: str) -> Any:
        try:
            alias, _, pk = str(result_id).rpartition(":")  # "ALIAS:ID": another job database
            if alias and alias not in job_databases():
                raise ValueError(alias)
            job = self._result_row(int(pk), alias or None)
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
        return results.from_job(job_class.task, self.alias, job)

    def _result_row(self, pk: int, alias: str | None = None) -> Job:
        """The job row of a result: from the read replica with ``results_from_replica``
        while it answers within its lag bound, unless it does not have the row yet (a task
        just enqueued); from the primary otherwise. ``alias``: another job database's
        row (it has no replica)."""
        if alias is not None:
            return Job.objects.using(alias).get(pk=pk)
        if self.results_from_replica:
            source = replicas.read_source()
            if source.on_replica:
                found = Job.objects.using(source.alias).filter(pk=pk).first()
                if found is not None:
                    return found
        return Job.objects.using(conf.database()).get(pk=pk)

    def running_result(self, task: Any, job: TaskJob, *, full: bool = True) -> Any:
        """The TaskResult of a task the calling worker thread is running (see
        :func:`django_gator.tasks.results.running`)."""
        return results.running(task, self.alias, job, full=full)

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
        attrs = {
            "name": name,
            "task": task,
            "backend_alias": self.alias,
            "retry": getattr(task, "retry", None) or self.default_retry,
            "timeout": getattr(task, "timeout", None) or self.default_timeout,
            "queue": task.queue_name,
            "priority": task.priority,
            "__module__": task.func.__module__,
            "__qualname__": f"TaskJob[{task.func.__qualname__}]",
        }
        return type(f"TaskJob_{task.func.__name__}", (TaskJob,), attrs)


def gator_backend() -> GatorBackend:
    """The first backend of the TASKS setting that is a GatorBackend."""
    for alias in getattr(settings, "TASKS", {}) or {}:
        backend = task_backends[alias]
        if isinstance(backend, GatorBackend):
            return backend
    raise LookupError("no TASKS backend is django_gator.tasks.GatorBackend")


def on_job_finished(sender: Any, job: Any, state: str, exception: Any, **kwargs: Any) -> None:
    """task_finished for a task whose attempt ended for good (not one that will retry)."""
    if not isinstance(job, TaskJob) or state == JobState.FAILED:
        return
    task = type(job).task
    backend = task.get_backend()
    wanted = listeners(task_finished, type(backend))
    if not wanted:
        return
    started = getattr(job, "_gator_task_result", None)
    if started is None or (wanted == FULL and started.enqueued_at is None):
        started = backend.running_result(task, job, full=wanted == FULL)
    value = getattr(job, "_gator_return_value", None)
    task_finished.send(
        type(backend), task_result=results.finished(started, state, exception, value)
    )


def connect_signals() -> None:
    job_finished.connect(on_job_finished, dispatch_uid="django_gator.tasks.finished")
