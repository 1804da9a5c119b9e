"""django-gator's tables: jobs, batches, workers, queues, cron schedules and their runs,
workflows and their steps, leases, and the finished jobs counted per minute.

Hot paths (dispatch, claim, outcome writes, rescue) are SQL in :mod:`django_gator.engines`,
one module per database; the models declare the schema, the indexes the claim query needs,
and the domain verbs used by the admin and the management commands.
"""

from django_gator.models.batches import Batch, BatchError
from django_gator.models.fairness import FairShare
from django_gator.models.flow import FlowStart
from django_gator.models.job_queries import (
    ERROR_CLASS_RE,
    JobQuerySet,
    Pruned,
    exception_class_name,
    record,
)
from django_gator.models.jobs import Job
from django_gator.models.leases import Lease, LeaseQuerySet
from django_gator.models.queues import Queue, QueueQuerySet
from django_gator.models.schedules import MisfirePolicy, Schedule, ScheduledRun, ScheduleSource
from django_gator.models.tallies import FinishedTally
from django_gator.models.workers import Worker
from django_gator.models.workflows import WorkflowRun, WorkflowStep
from django_gator.states import FINAL_STATES, READY_STATES, JobState

__all__ = [
    "ERROR_CLASS_RE",
    "FINAL_STATES",
    "READY_STATES",
    "Batch",
    "BatchError",
    "FairShare",
    "FinishedTally",
    "FlowStart",
    "Job",
    "JobQuerySet",
    "JobState",
    "Lease",
    "LeaseQuerySet",
    "MisfirePolicy",
    "Pruned",
    "Queue",
    "QueueQuerySet",
    "Schedule",
    "ScheduleSource",
    "ScheduledRun",
    "Worker",
    "WorkflowRun",
    "WorkflowStep",
    "exception_class_name",
    "record",
]
