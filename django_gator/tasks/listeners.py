"""Who listens to the framework's task signals: the worker reads a task's row for its
TaskResult only when a receiver other than the framework's own logging wants one."""

from __future__ import annotations

from typing import Any

#: Where the framework's own receivers live: they log a task's id, path and status.
FRAMEWORK_RECEIVERS = ("django.tasks.signals", "django_tasks.signals")
#: listeners(): nobody; only the framework's logging receivers; someone else.
NONE, LOGGING, FULL = 0, 1, 2


def listeners(signal: Any, sender: type) -> int:
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
        getattr(r, "__module__", "") in FRAMEWORK_RECEIVERS for r in sync_receivers
    )
    return LOGGING if only_logging else FULL
