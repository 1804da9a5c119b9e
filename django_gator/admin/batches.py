"""The batch page: a batch's counts by state, its progress, its members (filtered by
state) and a button that retries its dead members.

Viewing needs the job view permission; retrying needs ``retry_job``, by POST (CSRF-checked
by the admin site's ``admin_view``), and is recorded in each job's audit trail. A retry
re-opens a completed batch: its next completion dispatches ``on_complete`` again. The
batch of a workflow's batch step links to its workflow.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from django_gator.admin.listing import id_not_indexed
from django_gator.admin.pages import RETRY_PERMISSION, AdminPage, username
from django_gator.admin.workflows import step_of_batch
from django_gator.models import Batch, Job, JobState

MEMBERS_PER_PAGE = 100


def batch_url(batch_id: int) -> str:
    return reverse("admin:django_gator_job_batch", args=[batch_id])


def batch_link(job: Job) -> SafeString | str:
    """The job page's link to its batch ("-" for a job outside any batch)."""
    if job.batch_id is None:
        return "-"
    return format_html(
        '<a href="{}" id="gator-batch-link">batch #{}</a>', batch_url(job.batch_id), job.batch_id
    )


class BatchView(AdminPage):
    """``admin:django_gator_job_batch``: one batch (GET) and the retry of its dead members
    (POST)."""

    template_name = "admin/django_gator/job/batch.html"

    def get(self, request: HttpRequest, batch_id: int) -> HttpResponse:
        batch = get_object_or_404(Batch, pk=batch_id)
        counts = batch.counts()
        total = counts.pop("total")
        state = request.GET.get("state", "")
        if state not in JobState.values:
            state = ""
        # Ordered by an expression of the id, not the id: ordered by the id, PostgreSQL walks
        # the primary key from the oldest job and filters on the batch, which for a recent
        # batch of a table of millions reads nearly all of it (1.5 s at 5,000,000 rows). By
        # the expression it reads the members through the (batch_id, state) index and sorts
        # them.
        members = batch.members.order_by(id_not_indexed().asc())
        if state:
            members = members.filter(state=state)
        page = Paginator(
            members.only("id", "name", "state", "attempts", "finished_at", "last_error"),
            MEMBERS_PER_PAGE,
        ).get_page(request.GET.get("page"))
        ended = sum(counts[s] for s in (JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED))
        here = batch_url(batch.pk)
        step = step_of_batch(batch.pk)
        context = {
            **self.context(str(batch)),
            "batch": batch,
            "counts": [
                {"state": s, "count": n, "url": f"{here}?{urlencode({'state': s})}"}
                for s, n in counts.items()
            ],
            "total": total,
            "ended": ended,
            "percent": round(100 * ended / total) if total else 0,
            "state": state,
            "page": page,
            "can_retry": request.user.has_perm(RETRY_PERMISSION) and counts[JobState.DEAD] > 0,
            "step": step,
            "workflow_url": reverse(
                "admin:django_gator_workflowrun_change", args=[step.workflow_id]
            )
            if step is not None
            else "",
            "callbacks": [
                (field, getattr(batch, field))
                for field in ("on_success", "on_complete", "on_dead")
                if getattr(batch, field)
            ],
        }
        return self.render(context)

    def post(self, request: HttpRequest, batch_id: int) -> HttpResponse:
        if not request.user.has_perm(RETRY_PERMISSION):
            raise PermissionDenied
        batch = get_object_or_404(Batch, pk=batch_id)
        if request.POST.get("action") != "retry_dead":
            messages.error(request, f"Unknown action {request.POST.get('action', '')!r}.")
        else:
            changed = batch.members.filter(state=JobState.DEAD).retry(by=username(request))
            messages.success(request, f"{changed} dead member(s) of {batch} queued to run again.")
        return HttpResponseRedirect(batch_url(batch.pk))
