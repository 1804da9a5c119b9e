"""The job list's bulk actions, retry and cancel, and the permissions they need.

Each is a POST with Django's CSRF protection that first shows a confirmation page. Retrying
needs the ``django_gator.retry_job`` permission and cancelling ``django_gator.cancel_job``;
deleting (Django's own action) the usual delete permission.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.http import HttpRequest
from django.template.response import TemplateResponse

from django_gator.admin.pages import CANCEL_PERMISSION, RETRY_PERMISSION, breadcrumbs, username
from django_gator.models import JobQuerySet, JobState
from django_gator.validation import validate_queue


class JobActions(admin.ModelAdmin):
    """The base of ``JobAdmin`` that holds its actions (``permissions=["retry"]`` asks the
    ModelAdmin's ``has_retry_permission``, so they live on a ModelAdmin)."""

    actions = ("retry_jobs", "cancel_jobs", "delete_selected")
    confirm_template_name = "admin/django_gator/job/confirm_action.html"

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(RETRY_PERMISSION)

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(CANCEL_PERMISSION)

    def confirmation_page(
        self, request: HttpRequest, queryset: JobQuerySet, action: str, question: str
    ) -> TemplateResponse | None:
        """The confirmation page of a bulk action, or None once it was confirmed."""
        if request.POST.get("post") == "yes":
            return None
        ids = list(queryset.values_list("pk", flat=True)[:10_000])
        context = {
            **self.admin_site.each_context(request),
            **breadcrumbs(self, "Are you sure?"),
            "opts": self.model._meta,
            "title": "Are you sure?",
            "question": question.format(count=len(ids)),
            "jobs": list(queryset.order_by("-id")[:20]),
            "more": max(len(ids) - 20, 0),
            "ids": ids,
            "action": action,
        }
        return TemplateResponse(request, self.confirm_template_name, context)

    @admin.action(description="Retry the selected dead or failed jobs now", permissions=["retry"])
    def retry_jobs(self, request: HttpRequest, queryset: JobQuerySet) -> TemplateResponse | None:
        confirm = self.confirmation_page(
            request,
            queryset,
            "retry_jobs",
            "Retry {count} selected job(s)? Only dead and "
            "failed ones run again; they keep their error history.",
        )
        if confirm is not None:
            return confirm
        target = request.POST.get("target_queue", "").strip() or None
        if target is not None:
            try:
                validate_queue(target)
            except ValueError as exc:
                self.message_user(request, str(exc), messages.ERROR)
                return None
        self.retry_and_report(request, queryset, queue=target)
        return None

    def retry_and_report(
        self, request: HttpRequest, queryset: JobQuerySet, queue: str | None = None
    ) -> int:
        """Retry the dead and failed jobs of ``queryset`` (optionally onto ``queue``) in the
        requesting user's name, and say how many were and were not; the retry action and a
        job page's Retry button both come here once their checks have passed."""
        selected = queryset.count()
        changed = queryset.retry(by=username(request), queue=queue)
        self.message_user(request, f"{changed} job(s) queued to run again.", messages.SUCCESS)
        if changed < selected:
            self.message_user(
                request,
                f"{selected - changed} job(s) skipped: only dead and failed jobs can be retried, "
                "and a unique job not while another job holds its key.",
                messages.WARNING,
            )
        return changed

    @admin.action(
        description="Cancel the selected jobs (running ones are asked to stop)",
        permissions=["cancel"],
    )
    def cancel_jobs(self, request: HttpRequest, queryset: JobQuerySet) -> TemplateResponse | None:
        confirm = self.confirmation_page(
            request,
            queryset,
            "cancel_jobs",
            "Cancel {count} selected job(s)? Waiting and "
            "retrying ones never run again; running ones are asked to stop.",
        )
        if confirm is not None:
            return confirm
        selected = queryset.count()
        running = queryset.filter(state=JobState.RUNNING).count()
        changed = queryset.cancel()
        self.message_user(
            request,
            f"{changed} job(s) cancelled or, if running, asked to stop ({running} running).",
            messages.SUCCESS,
        )
        if changed < selected:
            self.message_user(
                request,
                f"{selected - changed} job(s) skipped: finished jobs cannot be cancelled.",
                messages.WARNING,
            )
        return None
