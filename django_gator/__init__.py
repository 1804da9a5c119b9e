"""django-gator: background jobs stored in your Django project's own database.

Public API::

    from django_gator import Queueable, job, Retry, Chain

Importing this package imports no models, so it is safe from settings or a models module.
"""

from django_gator.chain import Chain
from django_gator.exceptions import GatorError, JobNotRegistered
from django_gator.queueable import Queueable, get_job_class, job
from django_gator.retry import Retry

__version__ = "0.1.0.dev0"

__all__ = [
    "Chain",
    "GatorError",
    "JobNotRegistered",
    "Queueable",
    "Retry",
    "get_job_class",
    "job",
]
