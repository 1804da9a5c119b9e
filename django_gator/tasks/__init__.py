"""A backend for Django's Tasks framework (``django.tasks`` in Django 6.0+, the
``django-tasks`` package on Django 5.2): ``@task`` functions run on django-gator.

::

    TASKS = {"default": {"BACKEND": "django_gator.tasks.GatorBackend"}}

Each task is registered under its module path (``myapp.tasks.send_report``) when the
``@task`` decorator creates it, so the worker finds it through the registry like any job;
``gator_worker`` imports the ``tasks`` module of every installed app for that. An enqueue is
a row in the ``Job`` table, written in the caller's transaction; ``get_result()`` reads it
back as a ``TaskResult``.

The modules: :mod:`~django_gator.tasks.framework` (the framework's names, whichever
package provides them), :mod:`~django_gator.tasks.backend` (the backend and the job class
of a task), :mod:`~django_gator.tasks.results` (every TaskResult, built in one place) and
:mod:`~django_gator.tasks.listeners` (who listens to the task signals).
"""

from __future__ import annotations

from django_gator.tasks.backend import (
    GatorBackend,
    GatorTask,
    TaskJob,
    connect_signals,
    gator_backend,
)
from django_gator.tasks.framework import (
    FRAMEWORK,
    InvalidTaskError,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
    task_finished,
    task_started,
)
from django_gator.tasks.listeners import FULL, LOGGING, NONE, listeners
from django_gator.tasks.results import STATUS

__all__ = [
    "FRAMEWORK",
    "FULL",
    "LOGGING",
    "NONE",
    "STATUS",
    "GatorBackend",
    "GatorTask",
    "InvalidTaskError",
    "TaskError",
    "TaskJob",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "connect_signals",
    "gator_backend",
    "listeners",
    "task_enqueued",
    "task_finished",
    "task_started",
]
