"""The errors of the Celery-compatible front, named as Celery names them so that a
project's ``except`` clauses and ``pytest.raises`` keep working with the imports changed."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django_gator.exceptions import GatorError, JobTimeout, ResultTimeout

__all__ = [
    "MaxRetriesExceededError",
    "NotSupported",
    "Retry",
    "TaskRevokedError",
    "TimeLimitExceeded",
    "TimeoutError",
]


class NotSupported(GatorError, TypeError):
    """A Celery option, setting or call that django-gator has no faithful equivalent for:
    refused where it is written (a task's definition, an ``apply_async()`` call, the app's
    configuration), the message naming it and what to use instead."""


class Retry(GatorError):
    """Raised by ``self.retry()``: this attempt ends, and the job runs again after
    ``countdown`` seconds (its state is ``RETRY`` meanwhile). Let it propagate."""

    def __init__(
        self,
        message: str | None = None,
        exc: BaseException | None = None,
        when: float | datetime | None = None,
    ) -> None:
        self.exc = exc
        self.when = when
        self.message = message
        super().__init__(message, exc, when)

    @property
    def countdown(self) -> float:
        """Seconds before the next attempt."""
        if isinstance(self.when, datetime):
            from django.utils import timezone

            return max((self.when - timezone.now()).total_seconds(), 0.0)
        return float(self.when or 0)

    def __str__(self) -> str:
        if self.message:
            return self.message
        when = f" in {self.countdown:g}s" if self.when is not None else ""
        return f"Retry{when}: {self.exc!r}" if self.exc is not None else f"Retry{when}"

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.message, self.exc, self.when)


class MaxRetriesExceededError(GatorError):
    """``self.retry()`` was called once the task had used its ``max_retries`` (and no
    ``exc=`` was given to raise instead)."""


class TaskRevokedError(GatorError):
    """``get()`` of a task that was revoked (cancelled, or expired before it started)."""


class TimeoutError(ResultTimeout):
    """``AsyncResult.get(timeout=...)`` saw no end in time. A builtin ``TimeoutError`` too."""


#: What ``get()`` raises for a task stopped at its ``time_limit``: django-gator's
#: JobTimeout (the attempt fails at the limit; see docs/celery.md).
TimeLimitExceeded = JobTimeout
