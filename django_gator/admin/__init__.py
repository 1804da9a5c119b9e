"""django-gator's admin: jobs (with the dead-job screen, the dashboard and the argument
editor), workers and schedules.

Django's admin autodiscovery imports this package, which registers the three ModelAdmins
with the default admin site. Each module holds one screen or one concern: :mod:`.jobs`,
:mod:`.actions`, :mod:`.filters`, :mod:`.dead_jobs`, :mod:`.arguments`, :mod:`.dashboard`
and :mod:`.chart`, :mod:`.queues` (pause and resume), :mod:`.workers`, :mod:`.schedules`,
:mod:`.workflows` (a workflow's graph);
:mod:`.pages` and :mod:`.display` are what they share.
"""

from __future__ import annotations

from django.contrib import admin

from django_gator.admin.jobs import JobAdmin
from django_gator.admin.schedules import ScheduleAdmin, ScheduleForm
from django_gator.admin.workers import WorkerAdmin
from django_gator.admin.workflows import WorkflowRunAdmin
from django_gator.models import Job, JobState, Schedule, Worker, WorkflowRun

admin.site.register(Job, JobAdmin)
admin.site.register(Worker, WorkerAdmin)
admin.site.register(Schedule, ScheduleAdmin)
admin.site.register(WorkflowRun, WorkflowRunAdmin)

__all__ = [
    "JobAdmin",
    "JobState",
    "ScheduleAdmin",
    "ScheduleForm",
    "WorkerAdmin",
    "WorkflowRunAdmin",
]
