"""The job dashboard: per-queue counts, the age of the oldest due job and of the oldest
running one, the jobs running longer than ``GATOR_LONG_RUNNING_AFTER`` (flagged), the last
hour's throughput (a chart) and the live workers, with Pause and Resume buttons per queue
for users with the pause permission (see :mod:`.queues`). Needs the job view permission."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse

from django_gator import conf, stats
from django_gator.admin import reading
from django_gator.admin.chart import chart_svg
from django_gator.admin.pages import PAUSE_PERMISSION, AdminPage
from django_gator.engines import get_engine
from django_gator.models import JobState
from django_gator.tallies import finished_since


def throughput(minutes: int = 60, alias: str | None = None) -> list[dict[str, Any]]:
    """Succeeded and dead jobs per minute over the last ``minutes``, oldest first, from the
    workers' tallies in ``alias`` (default GATOR_DATABASE): a few rows per minute, however
    many jobs ended in it (see django_gator.tallies)."""
    alias = alias or conf.database()
    now = get_engine(alias).db_now().replace(second=0, microsecond=0)
    since = now - timedelta(minutes=minutes - 1)
    buckets = {
        since + timedelta(minutes=i): {JobState.SUCCEEDED.value: 0, JobState.DEAD.value: 0}
        for i in range(minutes)
    }
    for minute, _queue, succeeded, dead in finished_since(alias, since):
        bucket = buckets.get(minute.replace(second=0, microsecond=0))
        if bucket is not None:
            bucket[JobState.SUCCEEDED.value] += succeeded
            bucket[JobState.DEAD.value] += dead
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
