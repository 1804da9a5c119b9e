"""A Celery-compatible front: a Celery project's tasks run on django-gator with their
imports changed (``from celery import shared_task`` -> ``from django_gator.celery import
shared_task``). See docs/celery.md for every Celery concept and what it maps to; an
option with no faithful equivalent is refused where it is written, naming it.

Importing this package imports no models (tasks modules import it before Django's apps are
ready); dispatching and results do, when called."""

from __future__ import annotations

from typing import Any

from django_gator.celery.app import Celery, current_app, shared_task
from django_gator.celery.canvas import Signature, Task, chain, chord, group
from django_gator.celery.exceptions import (
    MaxRetriesExceededError,
    NotSupported,
    Retry,
    TaskRevokedError,
    TimeLimitExceeded,
    TimeoutError,
)
from django_gator.celery.task import Request

__all__ = [
    "AsyncResult",
    "Celery",
    "MaxRetriesExceededError",
    "NotSupported",
    "Request",
    "Retry",
    "Signature",
    "Task",
    "TaskRevokedError",
    "TimeLimitExceeded",
    "TimeoutError",
    "chain",
    "chord",
    "current_app",
    "group",
    "shared_task",
    "signature",
    "states",
]

#: Names imported on first use: they import the models.
_LAZY = {
    "AsyncResult": ("django_gator.celery.results", "AsyncResult"),
    "states": ("django_gator.celery.results", None),
}


def signature(task: Task, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
    """``signature(task, args, kwargs)``: as ``task.signature(...)``."""
    return task.signature(args, kwargs, **options)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'django_gator.celery' has no attribute {name!r}")
    from importlib import import_module

    module_name, attribute = _LAZY[name]
    module = import_module(module_name)
    return module if attribute is None else getattr(module, attribute)
