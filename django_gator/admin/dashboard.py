"""The job dashboard: per-queue counts, the age of the oldest due job and of the oldest
running one, the jobs running longer than ``GATOR_LONG_RUNNING_AFTER`` (flagged), the last
hour's throughput (a chart) and the live workers, with Pause and Resume buttons per queue
for users with the pause permission (see :mod:`.queues`). Needs the job view permission."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import Count
from django.db.models.functions import TruncMinute
from django.http import HttpRequest, HttpResponse

from django_gator import conf, stats
from django_gator.admin import reading
from django_gator.admin.chart import chart_svg
from django_gator.admin.pages import PAUSE_PERMISSION, AdminPage
from django_gator.engines import get_engine
from django_gator.models import Job, JobState


def throughput(minutes: int = 60, alias: str | None = None) -> list[dict[str, Any]]:
    """Succeeded and dead jobs per minute over the last ``minutes``, oldest first (read
    through the (state, finished_at) index), from ``alias`` (default GATOR_DATABASE)."""
    alias = alias or conf.database()
    now = get_engine(alias).db_now().replace(second=0, microsecond=0)
    since = now - timedelta(minutes=minutes - 1)
    rows = (
        Job.objects.using(alias)
        .filter(state__in=(JobState.SUCCEEDED, JobState.DEAD), finished_at__gte=since)
        .annotate(minute=TruncMinute("finished_at"))
        .values("minute", "state")
        .annotate(n=Count("id"))
        .order_by()
    )
    buckets = {
        since + timedelta(minutes=i): {JobState.SUCCEEDED.value: 0, JobState.DEAD.value: 0}
        for i in range(minutes)
    }
    for row in rows:
        minute = row["minute"]
        if minute is None:
            continue
        key = minute.replace(second=0, microsecond=0)
        if key in buckets:
            buckets[key][row["state"]] += row["n"]
    return [{"minute": minute, **counts} for minute, counts in sorted(buckets.items())]


#: Long-running jobs listed by the dashboard (the job list shows them all, flagged).
LONG_RUNNERS_SHOWN = 20


class DashboardView(AdminPage):
    """``admin:django_gator_job_dashboard``; ``?refresh=N`` reloads it every N seconds."""

    template_name = "admin/django_gator/job/dashboard.html"

    def get(self, request: HttpRequest) -> HttpResponse:
        alias = reading.alias(request)
        points = throughput(alias=alias)
        total, exact = stats.estimated_total(alias)
        now = get_engine(alias).db_now()
        queues = stats.queue_stats(alias, now=now)
        workers = stats.workers(alias, now=now)
        long_after = conf.long_running_after()
        long_runners = (
            stats.long_runners(long_after, alias, now=now, limit=LONG_RUNNERS_SHOWN + 1)
            if any(
                q.oldest_running_age is not None and q.oldest_running_age > long_after
                for q in queues
            )
            else []
        )
        context = {
            **self.context("Job dashboard"),
            "queues": queues,
            "workers": workers,
            "unserved": stats.unserved_queues(queues, workers),
            "long_after": long_after,
            "long_runners": long_runners[:LONG_RUNNERS_SHOWN],
            "more_long_runners": len(long_runners) > LONG_RUNNERS_SHOWN,
            "chart": chart_svg(points),
            "succeeded_hour": sum(p[JobState.SUCCEEDED.value] for p in points),
            "dead_hour": sum(p[JobState.DEAD.value] for p in points),
            "total": total,
            "total_estimated": not exact,
            "refresh": request.GET.get("refresh", ""),
            "can_pause": request.user.has_perm(PAUSE_PERMISSION),
        }
        return self.render(context)
