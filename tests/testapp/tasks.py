"""Django Tasks framework tasks (``@task``) that run on django-gator's backend; the worker
finds them because django_gator autodiscovers ``tasks`` modules when TASKS uses it."""

from __future__ import annotations

from typing import Any

from django_gator import Retry

try:
    from django.tasks import TaskContext, task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import TaskContext, task  # type: ignore[no-redef]


@task
def add_numbers(a: int, b: int) -> int:
    return a + b


@task(queue_name="tasks", priority=5)
def render_report(report_id: int, fmt: str = "pdf") -> dict[str, Any]:
    return {"report": report_id, "format": fmt}


@task(retry=Retry(interval=0, max_retries=2))
def always_fails(message: str) -> None:
    raise RuntimeError(message)


@task
def fails_without_retry() -> None:
    raise ValueError("no retry policy")


@task(takes_context=True)
def with_context(context: TaskContext, label: str) -> dict[str, Any]:
    return {"label": label, "attempt": context.attempt, "id": context.task_result.id}


@task
async def async_multiply(a: int, b: int) -> int:
    return a * b


@task(timeout=0.3, retry=Retry(interval=0, max_retries=0))
def too_slow() -> None:
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.01)
