"""The job list's filters, each read from an index or the registry rather than by a
``DISTINCT`` over the whole jobs table (Django's default for a field filter)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db.models import Q
from django.http import HttpRequest

from django_gator import conf
from django_gator.admin import reading
from django_gator.databases import job_databases
from django_gator.engines import get_engine
from django_gator.models import Job, JobState
from django_gator.queueable import registered_jobs
from django_gator.tallies import finished_since


class JobNameFilter(admin.SimpleListFilter):
    """Job names from the registry (no DISTINCT over the table)."""

    title = "job"
    parameter_name = "name"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in sorted(registered_jobs())]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        return queryset.filter(name=value) if value else queryset


class QueueFilter(admin.SimpleListFilter):
    """Every queue a job list may be filtered by, without a DISTINCT over every row
    (Django's default filter): those with unfinished or dead jobs or a row of their own
    (paused, limited), by the queue gauges' one statement over partial indexes; those
    whose jobs succeeded or died within the last hour, by the workers' tallies
    (django_gator.tallies: reading the finished rows of the last hour took 0.9-1.3 s at
    20,000,000 rows), or were cancelled within it, by the ``(state, finished_at)`` index; the
    queues the code and settings declare (the job classes', GATOR_QUEUES); and the one
    chosen."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        alias = reading.alias(request)
        now, gauges = get_engine(alias).queue_gauges()
        names = {gauge.queue for gauge in gauges}
        since = now - timedelta(hours=1)
        names.update(row[1] for row in finished_since(alias, since))
        # Cancellations are not tallied: the (state, finished_at) index's cancelled rows.
        jobs = Job.objects.using(alias)
        cancelled = jobs.filter(state=JobState.CANCELLED, finished_at__gte=since)
        names.update(cancelled.order_by().values_list("queue", flat=True).distinct())
        names.update(job_class.queue for job_class in registered_jobs().values())
        names.update(conf.queues())
        if self.value():
            names.add(str(self.value()))
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        return queryset.filter(queue=value) if value else queryset


def error_class_choices(jobs: Any = None) -> list[str]:
    """Error classes of dead and failed jobs (for the changelist filter), of ``jobs`` (by
    default every job)."""
    values = (
        (Job.objects.all() if jobs is None else jobs)
        .filter(Q(state=JobState.DEAD) | Q(state=JobState.FAILED))
        .exclude(error_class__isnull=True)
        .order_by()
        .values_list("error_class", flat=True)
        .distinct()[:200]
    )
    return sorted(value for value in values if value)


class ErrorClassFilter(admin.SimpleListFilter):
    """The dead and failed jobs of an error class. (A job that succeeded after a failed
    attempt keeps its error class, but is not listed: the filter reads the dead and failed
    rows' own index, where a filter on the class alone read the whole table: 1.2 s at
    5,000,000 rows.)"""

    title = "error class"
    parameter_name = "error_class"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        jobs = reading.using(request, Job.objects.all())
        return [(name, name) for name in error_class_choices(jobs)]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(state__in=(JobState.DEAD, JobState.FAILED), error_class=value)


class DatabaseFilter(admin.SimpleListFilter):
    """With several job databases (GATOR_QUEUE_DATABASES): which one the list reads (the
    rows are read there by :func:`django_gator.admin.reading.source`). Hidden, and
    costing nothing, with one."""

    title = "job database"
    parameter_name = reading.DATABASE_PARAM

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        if not conf.get("GATOR_QUEUE_DATABASES"):
            return []
        return [(alias, alias) for alias in job_databases()]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        return queryset  # read where reading.source() says
