"""The ``@job`` decorator: a job class (:class:`FunctionJob`) built around a plain
function, which stays callable as it was and gains ``dispatch()``."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from django_gator.queueable import Middleware, Queueable
from django_gator.retry import Retry

if TYPE_CHECKING:
    from django_gator.models import Job


class FunctionJob(Queueable, abstract=True):
    """The class ``@job`` builds around a plain function."""

    func: ClassVar[Callable[..., Any]]

    @classmethod
    def _handler_signature(cls) -> inspect.Signature:
        return inspect.signature(cls.func)

    @classmethod
    def _handler_is_async(cls) -> bool:
        return inspect.iscoroutinefunction(cls.func)

    def handle(self, *args: Any, **kwargs: Any) -> Any:
        return type(self).func(*args, **kwargs)


class JobFunction:
    """What ``@job`` returns: still callable as the plain function, plus ``dispatch``."""

    def __init__(self, func: Callable[..., Any], job_class: type[FunctionJob]) -> None:
        self.func = func
        self.job_class = job_class
        self.name = job_class.name
        functools.update_wrapper(self, func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def dispatch(self, *args: Any, **kwargs: Any) -> Job:
        return self.job_class.dispatch(*args, **kwargs)

    def dispatch_many(self, arguments: Iterable[Any], **options: Any) -> list[Job]:
        return self.job_class.dispatch_many(arguments, **options)

    async def adispatch(self, *args: Any, **kwargs: Any) -> Job:
        return await self.job_class.adispatch(*args, **kwargs)

    async def adispatch_many(self, arguments: Iterable[Any], **options: Any) -> list[Job]:
        return await self.job_class.adispatch_many(arguments, **options)

    def __repr__(self) -> str:
        return f"<job {self.name}>"


_UNSET: Any = object()


def job(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    queue: str = _UNSET,
    priority: int = _UNSET,
    retry: Retry | None = _UNSET,
    timeout: float | None = _UNSET,
    unique: bool = _UNSET,
    atomic: bool = _UNSET,
    middleware: Sequence[Middleware] = _UNSET,
    schedule: Any = _UNSET,
    concurrency_limit: int | None = _UNSET,
    rate_limit: str | None = _UNSET,
    concurrency_key: Callable[..., str | None] = _UNSET,
) -> Any:
    """Turn a function into a job: ``@job`` or ``@job(queue="critical", retry=Retry(...))``.

    The options are the Queueable class attributes of the same names; ``concurrency_key``
    is a function of the job's arguments."""

    def wrap(f: Callable[..., Any]) -> JobFunction:
        attrs: dict[str, Any] = {
            "func": staticmethod(f),
            "__module__": f.__module__,
            "__qualname__": f.__qualname__,
            "__doc__": f.__doc__,
            "name": name or f"{f.__module__}.{f.__qualname__}",
        }
        for key, value in (
            ("queue", queue),
            ("priority", priority),
            ("retry", retry),
            ("timeout", timeout),
            ("unique", unique),
            ("atomic", atomic),
            ("middleware", middleware),
            ("schedule", schedule),
            ("concurrency_limit", concurrency_limit),
            ("rate_limit", rate_limit),
        ):
            if value is not _UNSET:
                attrs[key] = value
        if concurrency_key is not _UNSET:
            keyer = concurrency_key
            attrs["concurrency_key"] = lambda self, *args, **kwargs: keyer(*args, **kwargs)
        job_class = type(f.__name__, (FunctionJob,), attrs)
        return JobFunction(f, job_class)

    return wrap(func) if func is not None else wrap


def resolve_job_class(target: type[Queueable] | JobFunction) -> type[Queueable]:
    """Accept a Queueable subclass or a ``@job`` function wherever a job is named."""
    if isinstance(target, type) and issubclass(target, Queueable) and hasattr(target, "name"):
        return target
    # A @job function, or anything else built around a job class (a Celery-front task).
    job_class = getattr(target, "job_class", None)
    if isinstance(job_class, type) and issubclass(job_class, Queueable):
        return job_class
    raise TypeError(f"expected a Queueable subclass or a @job function, got {target!r}")
