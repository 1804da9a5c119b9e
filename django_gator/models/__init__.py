"""django-gator's tables: jobs, workers, queues, cron schedules and their runs.

Hot paths (dispatch, claim, outcome writes, rescue) are SQL in :mod:`django_gator.engines`,
one module per database; the models declare the schema, the indexes the claim query needs,
and the domain verbs used by the admin and the management commands.
"""

from django_gator.models.flow import FlowStart
from django_gator.models.jobs import (
    ERROR_CLASS_RE,
    Job,
    JobQuerySet,
    Pruned,
    exception_class_name,
    record,
)
from django_gator.models.queues import Queue, QueueQuerySet
from django_gator.models.schedules import MisfirePolicy, Schedule, ScheduledRun, ScheduleSource
from django_gator.models.workers import Worker
from django_gator.states import FINAL_STATES, READY_STATES, JobState

__all__ = [
    "ERROR_CLASS_RE",
    "FINAL_STATES",
    "READY_STATES",
    "FlowStart",
    "Job",
    "JobQuerySet",
    "JobState",
    "MisfirePolicy",
    "Pruned",
    "Queue",
    "QueueQuerySet",
    "Schedule",
    "ScheduleSource",
    "ScheduledRun",
    "Worker",
    "exception_class_name",
    "record",
]
