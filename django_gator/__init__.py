"""django-gator: background jobs stored in your Django project's own database.

Public API::

    from django_gator import Queueable, job, Retry, Chain, Snooze

Importing this package imports no models, so it is safe from settings or a models module.
"""

from django_gator.chain import Chain
from django_gator.exceptions import GatorError, JobCancelled, JobNotRegistered, Snooze
from django_gator.queueable import Queueable, job
from django_gator.registry import get_job_class
from django_gator.retry import Retry
from django_gator.schedules import Cron

__version__ = "0.1.0.dev0"

__all__ = [
    "Chain",
    "Cron",
    "GatorError",
    "JobCancelled",
    "JobNotRegistered",
    "Queueable",
    "Retry",
    "Snooze",
    "get_job_class",
    "job",
]
