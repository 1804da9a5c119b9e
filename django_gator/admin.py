"""The Job admin: a read-only browser of jobs; changes happen through permissioned actions.

Admin actions are POST requests with Django's CSRF protection. Retrying needs the
``django_gator.retry_job`` permission and cancelling ``django_gator.cancel_job``; deleting
needs the usual delete permission.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from django_gator.models import Job, JobQuerySet, JobState, Worker


def _pretty(value: Any) -> SafeString:
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    return format_html('<pre class="gator-json">{}</pre>', text)


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "name",
        "queue",
        "state",
        "priority",
        "attempts",
        "next_execution_at",
        "finished_at",
        "error_summary",
    )
    list_filter = ("state", "queue", "created_at", "finished_at")
    search_fields = ("=id", "name", "last_error")
    date_hierarchy = None
    list_per_page = 50
    show_full_result_count = False
    ordering = ("-id",)
    actions = ("retry_jobs", "cancel_jobs")
    fieldsets = (
        (None, {"fields": ("id", "name", "state", "queue", "priority")}),
        ("Payload", {"fields": ("args_pretty", "kwargs_pretty", "result_pretty")}),
        (
            "Timing",
            {
                "fields": (
                    "created_at",
                    "next_execution_at",
                    "started_at",
                    "locked_at",
                    "finished_at",
                )
            },
        ),
        ("Attempts", {"fields": ("attempts", "rescues", "reserved_by", "last_error")}),
        ("Error history", {"fields": ("error_history_html",)}),
        ("Chain", {"fields": ("chain_id", "chain_position", "chain")}),
    )
    readonly_fields = (
        "id",
        "name",
        "state",
        "queue",
        "priority",
        "args_pretty",
        "kwargs_pretty",
        "result_pretty",
        "created_at",
        "next_execution_at",
        "started_at",
        "locked_at",
        "finished_at",
        "attempts",
        "rescues",
        "reserved_by",
        "last_error",
        "error_history_html",
        "chain_id",
        "chain_position",
        "chain",
    )

    # Rows are changed by workers and actions only.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_gator.retry_job")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_gator.cancel_job")

    @admin.display(description="last error")
    def error_summary(self, job: Job) -> str:
        return Truncator(job.last_error).chars(80)

    @admin.display(description="args")
    def args_pretty(self, job: Job) -> SafeString:
        return _pretty(job.args)

    @admin.display(description="kwargs")
    def kwargs_pretty(self, job: Job) -> SafeString:
        return _pretty(job.kwargs)

    @admin.display(description="result")
    def result_pretty(self, job: Job) -> SafeString:
        return _pretty(job.result)

    @admin.display(description="errors, oldest first")
    def error_history_html(self, job: Job) -> SafeString:
        entries = job.error_history
        if not entries:
            return format_html("<p>{}</p>", "No errors.")
        return format_html_join(
            "\n",
            "<details><summary>Attempt {} &middot; {} &middot; {}: {} &middot; worker {}"
            "</summary><pre>{}</pre></details>",
            (
                (
                    e.get("attempt", "?"),
                    e.get("at", ""),
                    e.get("class", ""),
                    Truncator(str(e.get("message", ""))).chars(200),
                    e.get("worker", ""),
                    e.get("traceback", "") or "(no traceback)",
                )
                for e in entries
            ),
        )

    @admin.action(description="Retry the selected dead or failed jobs now", permissions=["retry"])
    def retry_jobs(self, request: HttpRequest, queryset: JobQuerySet) -> None:
        selected = queryset.count()
        changed = queryset.retry()
        self.message_user(request, f"{changed} job(s) queued to run again.", messages.SUCCESS)
        if changed < selected:
            self.message_user(
                request,
                f"{selected - changed} job(s) skipped: only dead and failed jobs can be retried.",
                messages.WARNING,
            )

    @admin.action(
        description="Cancel the selected jobs that have not started", permissions=["cancel"]
    )
    def cancel_jobs(self, request: HttpRequest, queryset: JobQuerySet) -> None:
        selected = queryset.count()
        changed = queryset.cancel()
        self.message_user(request, f"{changed} job(s) cancelled.", messages.SUCCESS)
        if changed < selected:
            self.message_user(
                request,
                f"{selected - changed} job(s) skipped: running and finished jobs cannot be "
                "cancelled.",
                messages.WARNING,
            )


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ("id", "hostname", "pid", "queues", "concurrency", "started_at", "heartbeat_at")
    readonly_fields = list_display

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


__all__ = ["JobAdmin", "JobState", "WorkerAdmin"]
