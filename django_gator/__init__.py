"""django-gator: background jobs stored in your Django project's own database.

Public API::

    from django_gator import Queueable, job, Retry, Chain, Workflow, Snooze, pause_queue,
    resume_queue
    from django_gator import Batch

Importing this package imports no models, so it is safe from settings or a models module.
"""

from django_gator.chain import Chain
from django_gator.exceptions import GatorError, JobCancelled, JobNotRegistered, Snooze
from django_gator.jobfunction import job
from django_gator.queueable import Queueable
from django_gator.registry import get_job_class
from django_gator.retry import Retry
from django_gator.schedules import Cron
from django_gator.workflows import Workflow

__version__ = "0.1.0.dev0"


def __getattr__(name: str) -> object:
    """``Batch`` is a model: imported on first use, so that `import django_gator` loads
    no models."""
    if name == "Batch":
        from django_gator.models.batches import Batch

        return Batch
    raise AttributeError(f"module 'django_gator' has no attribute {name!r}")


def pause_queue(name: str, *, by: str | None = None) -> bool:
    """Stop every worker claiming jobs of the queue ``name`` until it is resumed; jobs keep
    arriving and wait, running ones finish. True if it was not paused already (a second
    pause keeps the first one's who and when). ValueError if ``name`` is not a valid queue
    name. See :mod:`django_gator.pausing`."""
    # Imported here so that `import django_gator` loads no models.
    from django_gator import pausing

    return pausing.pause_queue(name, by=by)


def resume_queue(name: str, *, by: str | None = None) -> bool:
    """Let the workers claim the jobs of the queue ``name`` again (on PostgreSQL, idle
    workers are woken at once). True if it was paused. ValueError if ``name`` is not a
    valid queue name."""
    # Imported here so that `import django_gator` loads no models.
    from django_gator import pausing

    return pausing.resume_queue(name, by=by)


__all__ = [
    "Batch",
    "Chain",
    "Cron",
    "GatorError",
    "JobCancelled",
    "JobNotRegistered",
    "Queueable",
    "Retry",
    "Snooze",
    "Workflow",
    "get_job_class",
    "job",
    "pause_queue",
    "resume_queue",
]
