"""A Celery task on django-gator: :class:`Task` (what ``@shared_task`` and ``@app.task``
return) and :class:`CeleryJob` (the job class it dispatches, a ``@job`` function's class
whose ``handle()`` runs the task as Celery's worker would: its ``self.request``, its
``autoretry_for``, its ``self.retry()``)."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from django.conf import settings
from django.utils import timezone

from django_gator.celery import options as opts
from django_gator.celery.exceptions import MaxRetriesExceededError, NotSupported, Retry
from django_gator.jobfunction import FunctionJob

if TYPE_CHECKING:
    from django_gator.celery.app import Celery
    from django_gator.celery.results import AsyncResult

#: In a chain or chord, the first argument of a step that receives the result of the step
#: before it (Celery's "partial" signature); the job fills it in when it runs.
PARENT_RESULT = {"celery": "the result of the previous task"}


@dataclass
class Request:
    """``self.request`` of a bound task: what Celery's task request says, for the job
    being run (``id`` is the job's id, as a str; ``retries`` the retries before this
    attempt). Outside a worker, ``called_directly`` is True and ``id`` None."""

    id: str | None = None
    retries: int = 0
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    task: str | None = None
    is_eager: bool = False
    called_directly: bool = True
    delivery_info: dict[str, Any] = field(default_factory=dict)


_request: ContextVar[Request | None] = ContextVar("gator_celery_request", default=None)

#: The current app (the last one created): the one ``@shared_task`` tasks use.
_current: list[Celery] = []


def set_current(app: Celery) -> None:
    _current[:] = [app]


def get_current() -> Celery:
    return _current[0]


class CeleryJob(FunctionJob, abstract=True):
    """The job class of a Celery task: no retry policy of its own (a task retries only
    through ``self.retry()`` or ``autoretry_for``, as in Celery)."""

    celery_task: ClassVar[BaseTask]

    @classmethod
    def _handler_signature(cls) -> inspect.Signature:
        signature = inspect.signature(cls.func)
        if cls.celery_task.bind:
            params = list(signature.parameters.values())[1:]
            signature = signature.replace(parameters=params)
        return signature

    def handle(self, *args: Any, **kwargs: Any) -> Any:
        task = type(self).celery_task
        if args and args[0] == PARENT_RESULT:
            args = (_parent_result(self.results()), *args[1:])
        request = Request(
            id=str(self.job_id),
            retries=self.attempt - 1,
            args=list(args),
            kwargs=dict(kwargs),
            task=task.name,
            is_eager=task.app.eager_now,
            called_directly=False,
            delivery_info={"routing_key": self.queue},
        )
        token = _request.set(request)
        try:
            result = task._run_with_autoretry(args, kwargs)
        finally:
            _request.reset(token)
        return None if task.ignore_result else result

    def retry_decision(self, exc: BaseException, retry_count: int) -> float | bool:
        """Celery retries only what ``self.retry()`` (or ``autoretry_for``) raised; any
        other error ends the task (FAILURE)."""
        if isinstance(exc, Retry):
            return exc.countdown
        return False


def _parent_result(results: dict[str, Any]) -> Any:
    """What Celery passes on: the previous task's result; a group's (a chord's header):
    the list of its results, in order."""
    values = list(results.values())
    if len(values) == 1:
        return values[0]
    return values


class BaseTask:
    """A Celery task: call it to run the function here, ``delay()``/``apply_async()`` to
    dispatch it; bound tasks get ``self.request`` and ``self.retry()``. Its signatures
    (``s()``, ``si()``) are added by :class:`django_gator.celery.canvas.Task`."""

    def __init__(
        self, func: Callable[..., Any], app: Celery | None, options: dict[str, Any]
    ) -> None:
        where = f"@task {func.__module__}.{func.__qualname__}"
        if inspect.iscoroutinefunction(func):
            raise NotSupported(f"{where}: async def tasks are not Celery's; use django_gator @job")
        checked = opts.task_options(where, options)
        self._app = app
        self.run = func
        self.options = checked
        self.bind: bool = checked["bind"]
        self.name: str = checked["name"] or f"{func.__module__}.{func.__name__}"
        self.queue: str | None = checked["queue"]
        self.priority: int | None = checked["priority"]
        self.max_retries: int | None = checked["max_retries"]
        self.default_retry_delay: float = checked["default_retry_delay"]
        self.autoretry_for: tuple[type[BaseException], ...] = checked["autoretry_for"]
        self.dont_autoretry_for: tuple[type[BaseException], ...] = checked["dont_autoretry_for"]
        self.ignore_result: bool = checked["ignore_result"]
        self.rate_limit: str | None = checked["rate_limit"]
        self.time_limit: float | None = checked["time_limit"]
        self.__name__, self.__doc__ = func.__name__, func.__doc__
        self.__module__, self.__qualname__ = func.__module__, func.__qualname__
        if settings.configured:
            self.app.conf.check()  # a setting it cannot honour: refused at definition
        self.job_class = self._job_class(func)

    def _job_class(self, func: Callable[..., Any]) -> type[CeleryJob]:
        attrs: dict[str, Any] = {
            "func": staticmethod(func),
            "celery_task": self,
            "__module__": func.__module__,
            "__qualname__": func.__qualname__,
            "__doc__": func.__doc__,
            "name": self.name,
            "timeout": self.time_limit,
            "rate_limit": self.rate_limit,
            "expires": self.options["expires"],
        }
        if self.queue is not None:
            attrs["queue"] = self.queue
        if self.priority is not None:
            attrs["priority"] = self.priority
        return type(func.__name__, (CeleryJob,), attrs)

    def __repr__(self) -> str:
        return f"<@task: {self.name}>"

    @property
    def app(self) -> Celery:
        """Its app: ``@app.task``'s, else (``@shared_task``) the current one."""
        return self._app or _current[0]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function here and now, as Celery does (no job, no retry)."""
        if self.bind:
            return self.run(self, *args, **kwargs)
        return self.run(*args, **kwargs)

    @property
    def request(self) -> Request:
        return _request.get() or Request(task=self.name)

    def _run_with_autoretry(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        try:
            return self(*args, **kwargs)
        except Retry:
            raise
        except self.dont_autoretry_for:
            raise
        except self.autoretry_for as exc:
            retry_kwargs = dict(self.options["retry_kwargs"])
            if self.options["retry_backoff"]:
                retry_kwargs["countdown"] = opts.backoff_countdown(
                    self.options, self.request.retries
                )
            raise self.retry(exc=exc, **retry_kwargs) from exc

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: BaseException | None = None,
        throw: bool = True,
        eta: datetime | None = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Retry:
        """End this attempt and run the task again after ``countdown`` seconds (default
        ``default_retry_delay``) or at ``eta``: raises :class:`Retry`. Past
        ``max_retries`` (this call's, else the task's) raises ``exc``, or
        MaxRetriesExceededError without one."""
        where = f"{self.name}.retry()"
        for key, value in {"args": args, "kwargs": kwargs, **options}.items():
            if value is not None:
                raise opts.refuse(where, key, value, "a retry runs the same arguments again")
        if not throw:
            raise opts.refuse(where, "throw", throw, "a retry is scheduled by raising Retry")
        request = self.request
        if request.called_directly:
            # As Celery: called outside a worker, there is nothing to retry.
            raise exc or sys.exception() or Retry("Task can be retried", None)
        limit = self.max_retries if max_retries is None else max_retries
        if limit is not None and request.retries >= limit:
            if exc is not None:
                raise exc
            raise MaxRetriesExceededError(
                f"Can't retry {self.name}[{request.id}] args:{request.args} kwargs:{request.kwargs}"
            )
        when: float | datetime = self.default_retry_delay if countdown is None else countdown
        raise Retry(exc=exc, when=eta if eta is not None else when)

    # Dispatching --------------------------------------------------------------------------

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        return self.apply_async(args, kwargs)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        countdown: float | None = None,
        eta: datetime | None = None,
        expires: float | timedelta | datetime | None = None,
        queue: str | None = None,
        priority: int | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Dispatch the task (with the queue of ``queue=``, else the task's, else the
        routes', else ``task_default_queue``); returns its AsyncResult."""
        opts.call_options(f"{self.name}.apply_async()", options)
        if countdown is not None and eta is not None:
            raise ValueError(f"{self.name}.apply_async(): pass countdown= or eta=, not both")
        from django_gator.dispatch import enqueue  # imports the models: not at import time

        job = enqueue(
            self.job_class,
            [(tuple(args or ()), dict(kwargs or {}))],
            wait=countdown,
            at=eta,
            queue=self.app.route_queue(self, queue),
            priority=self.app.route_priority(self, priority),
            on_commit=False if self.app.eager_now else None,
            expires_at=expires_at(expires),
        )[0]
        return self.app.finish_dispatch([job.pk], self.AsyncResult(job.pk), job._state.db)

    def apply(
        self, args: Sequence[Any] | None = None, kwargs: dict[str, Any] | None = None
    ) -> AsyncResult:
        """Run the task now, in this thread (as a worker would: a job row, its retries at
        once), as Celery's ``apply()``; returns its AsyncResult."""
        with self.app.eager():
            return self.apply_async(args, kwargs)

    def AsyncResult(self, task_id: str | int) -> AsyncResult:
        from django_gator.celery.results import AsyncResult

        return AsyncResult(task_id)


def expires_at(expires: float | timedelta | datetime | None) -> datetime | None:
    """Celery's ``expires=`` (seconds from now, a timedelta, or an aware datetime) as the
    job's ``expires_at``."""
    if expires is None or isinstance(expires, datetime):
        return expires
    if isinstance(expires, timedelta):
        return timezone.now() + expires
    if isinstance(expires, bool) or not isinstance(expires, int | float) or expires <= 0:
        raise ValueError(f"expires must be seconds > 0, a timedelta or a datetime: {expires!r}")
    return timezone.now() + timedelta(seconds=expires)
