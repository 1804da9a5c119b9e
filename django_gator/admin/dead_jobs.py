"""The dead-job screen: dead (and failed) jobs grouped by job name and error class, each
group retried (optionally onto another queue) or discarded at once.

Viewing needs the job view permission; retrying a group needs ``retry_job`` and
discarding one ``cancel_job``. A change is a POST that first shows a confirmation page
saying how many jobs it touches, and is recorded in each job's audit trail with the user's
name.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Max
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.text import Truncator
from django.utils.translation import gettext as _

from django_gator import redaction, validation
from django_gator.admin import reading
from django_gator.admin.pages import CANCEL_PERMISSION, RETRY_PERMISSION, AdminPage, username
from django_gator.models import Job, JobQuerySet, JobState

#: The states the dead-job screen shows: "dead", "failed" (retry pending) or both.
SCREEN_STATES = {
    JobState.DEAD.value: (JobState.DEAD,),
    JobState.FAILED.value: (JobState.FAILED,),
    "both": (JobState.DEAD, JobState.FAILED),
}
MAX_GROUPS = 200


def screen_filters(data: Any) -> dict[str, str]:
    """The screen's filters from GET or POST data, as strings ('' when absent)."""
    state = data.get("state", JobState.DEAD.value)
    return {
        "state": state if state in SCREEN_STATES else JobState.DEAD.value,
        "name": str(data.get("name", "")),
        "error_class": str(data.get("error_class", "")),
        "queue": str(data.get("queue", "")),
    }


def matching(filters: dict[str, str], request: HttpRequest | None = None) -> JobQuerySet:
    """The jobs the screen's ``filters`` select, where ``request`` reads (see
    :mod:`.reading`)."""
    jobs: JobQuerySet = Job.objects.all()
    if request is not None:
        jobs = reading.using(request, jobs)
    jobs = jobs.filter(state__in=SCREEN_STATES[filters["state"]])
    if filters["name"]:
        jobs = jobs.filter(name=filters["name"])
    if filters["error_class"]:
        try:
            jobs = jobs.raised(filters["error_class"], exact=True)
        except ValueError:  # not a class name (a hand-edited URL): it matches nothing
            jobs = jobs.none()
    if filters["queue"]:
        jobs = jobs.filter(queue=filters["queue"])
    return jobs


class DeadJobsView(AdminPage):
    """``admin:django_gator_job_dead``: the groups (GET) and a group's retry or discard
    (POST, confirmed first)."""

    template_name = "admin/django_gator/job/dead_jobs.html"
    confirm_template_name = "admin/django_gator/job/confirm_bulk.html"

    def get(self, request: HttpRequest) -> HttpResponse:
        filters = screen_filters(request.GET)
        jobs = matching(filters, request)
        groups: list[dict[str, Any]] = [
            dict(group)
            for group in jobs.values("name", "error_class")
            .annotate(count=Count("id"), newest=Max("id"))
            .order_by("-count", "name", "error_class")[:MAX_GROUPS]
        ]
        newest = reading.using(request, Job.objects.all()).in_bulk([g["newest"] for g in groups])
        changelist = reverse("admin:django_gator_job_changelist")
        for group in groups:
            job = newest[group["newest"]]
            secrets = redaction.job_secret_values(job.name, job.args, job.kwargs, job.audit)
            group["message"] = Truncator(redaction.mask_text(job.last_error, secrets)).chars(300)
            group["at"] = job.finished_at or job.next_execution_at
            group["queue"] = job.queue
            query = {"name": group["name"], "error_class": group["error_class"] or ""}
            query_states = SCREEN_STATES[filters["state"]]
            if len(query_states) == 1:
                query["state"] = query_states[0]
            if reading.picked_database(request) is not None:
                query[reading.DATABASE_PARAM] = reading.alias(request)
            group["jobs_url"] = f"{changelist}?{urlencode(query)}"
        context = {
            **self.context("Dead jobs"),
            "filters": filters,
            "states": list(SCREEN_STATES),
            "groups": groups,
            "total": jobs.count(),
            "truncated": len(groups) == MAX_GROUPS,
            "can_retry": request.user.has_perm(RETRY_PERMISSION),
            "can_discard": request.user.has_perm(CANCEL_PERMISSION),
            "names": sorted(
                jobs.order_by().values_list("name", flat=True).distinct()[:500]
                if not filters["name"]
                else [filters["name"]]
            ),
        }
        return self.render(context)

    def post(self, request: HttpRequest) -> HttpResponse:
        action = request.POST.get("action", "")
        filters = screen_filters(request.POST)
        here = (
            reverse("admin:django_gator_job_dead")
            + "?"
            + urlencode({k: v for k, v in filters.items() if k == "state"})
        )
        if action == "retry":
            if not request.user.has_perm(RETRY_PERMISSION):
                raise PermissionDenied
        elif action == "discard":
            if not request.user.has_perm(CANCEL_PERMISSION):
                raise PermissionDenied
        else:
            messages.error(request, f"Unknown action {action!r}.")
            return HttpResponseRedirect(here)
        target_queue = request.POST.get("target_queue", "").strip() or None
        if target_queue is not None:
            try:
                validation.validate_queue(target_queue)
            except ValueError as exc:
                messages.error(request, str(exc))
                return HttpResponseRedirect(here)
        jobs = matching(filters, request)
        if request.POST.get("confirm") != "yes":
            return self.confirmation_page(action, filters, jobs, target_queue)
        if action == "retry":
            changed = jobs.retry(by=username(request), queue=target_queue)
            where = f" onto queue {target_queue!r}" if target_queue else ""
            messages.success(request, f"{changed} job(s) queued to run again{where}.")
        else:
            changed = jobs.discard(by=username(request))
            messages.success(request, f"{changed} job(s) discarded (now cancelled).")
        return HttpResponseRedirect(here)

    def confirmation_page(
        self, action: str, filters: dict[str, str], jobs: JobQuerySet, target_queue: str | None
    ) -> HttpResponse:
        """The page asking whether to ``action`` the ``jobs`` (how many, in which groups)."""
        context = {
            **self.context(
                "Are you sure?", (reverse("admin:django_gator_job_dead"), _("Dead jobs"))
            ),
            "action": action,
            "count": jobs.count(),
            "filters": filters,
            "target_queue": target_queue or "",
            "groups": list(
                jobs.values("name", "error_class").annotate(count=Count("id")).order_by("name")
            )[:50],
        }
        return self.render(context, self.confirm_template_name)
