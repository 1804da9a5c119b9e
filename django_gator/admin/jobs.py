"""The Job admin: a read-only browser of jobs; changes happen through permissioned actions.

Rows are changed by workers and by the operator's actions only: the job list's retry and
cancel actions (:mod:`.actions`), a job page's Retry button and argument editor
(:mod:`.arguments`), the dead-job screen (:mod:`.dead_jobs`) and the dashboard's queue
buttons (:mod:`.queues`), each a POST with Django's
CSRF protection behind its own permission. Argument values named by ``GATOR_REDACT`` are
masked on every page.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from django_gator import conf, redaction, wording
from django_gator.admin.actions import JobActions
from django_gator.admin.arguments import EditArgumentsView, last_restorable_edit
from django_gator.admin.audit import AuditDisplay
from django_gator.admin.batches import BatchView, batch_link
from django_gator.admin.dashboard import DashboardView
from django_gator.admin.dead_jobs import DeadJobsView
from django_gator.admin.display import pretty, running_for, time_field, when
from django_gator.admin.filters import DatabaseFilter, ErrorClassFilter, JobNameFilter, QueueFilter
from django_gator.admin.limits import QueueLimitsView
from django_gator.admin.listing import JobListing
from django_gator.admin.progress import ProgressDisplay
from django_gator.admin.queues import QueuePauseView
from django_gator.admin.reading import ReadingAdmin, job_url, wrote
from django_gator.admin.windows import WindowDisplay
from django_gator.admin.workflows import workflow_link
from django_gator.models import Job, JobState

#: The states in which a job's last error says why it is where it is; a job that succeeded
#: (or waits or runs again) after a failed attempt keeps that error in its history only.
ERROR_STATES = (JobState.FAILED, JobState.DEAD, JobState.CANCELLED)
#: Characters of the last error shown in the job list (the full text is its tooltip).
LIST_ERROR_CHARS = 40


#: The "Attempts" part of a job's page.
ATTEMPT_FIELDS = (
    "attempts",
    "snoozes",
    "rescues",
    "handbacks",
    "outages",
    "reserved_by",
    "error_class",
    "last_error_shown",
)


class JobAdmin(JobListing, ProgressDisplay, WindowDisplay, AuditDisplay, JobActions, ReadingAdmin):
    # Sized to fit a 1400 px window with the navigation sidebar and the filters open (a
    # browser test measures it): names wrap after their dots, times after the date, errors
    # anywhere, and the error is cut short.
    list_display = (
        "id",
        "job_name",
        "queue",
        "state",
        "priority",
        "attempts",
        "next_run",
        "error_summary",
    )
    list_filter = (
        DatabaseFilter,
        "state",
        QueueFilter,
        JobNameFilter,
        ErrorClassFilter,
        "created_at",
        "finished_at",
    )
    date_hierarchy = None
    list_per_page = 50
    show_full_result_count = False
    ordering = ("-id",)
    fieldsets = (
        (None, {"fields": ("id", "name", "state", "queue", "priority")}),
        ("Payload", {"fields": ("args_pretty", "kwargs_pretty", "result_pretty")}),
        ("Progress", {"fields": ("progress_html", "checkpoint_html")}),
        ("Keys and expiry", {"fields": ("key_window", "fairness", "expiry")}),
        (
            "Timing",
            {
                "fields": (
                    "created",
                    "next_execution",
                    "started",
                    "locked",
                    "finished",
                )
            },
        ),
        (
            "Attempts",
            {"fields": ATTEMPT_FIELDS},
        ),
        ("Error history", {"fields": ("error_history_html",)}),
        ("Captured logs", {"fields": ("logs_html",)}),
        ("Operator actions", {"fields": ("operator_tools", "audit_html")}),
        ("Workflow or chain", {"fields": ("workflow", "chain_position")}),
        ("Batch", {"fields": ("batch",)}),
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
        "progress_html",
        "checkpoint_html",
        "key_window",
        "fairness",
        "expiry",
        "created",
        "next_execution",
        "started",
        "locked",
        "finished",
        *ATTEMPT_FIELDS,
        "error_history_html",
        "logs_html",
        "operator_tools",
        "audit_html",
        "workflow",
        "chain_position",
        "batch",
    )

    @admin.display(description="workflow")
    def workflow(self, job: Job) -> Any:
        """A link to the page of the job's workflow (a chain is one)."""
        return workflow_link(job, self.admin_site.name)

    @admin.display(description="Batch")
    def batch(self, obj: Job) -> SafeString | str:
        return batch_link(obj)

    # Rows are changed by workers and actions only.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The operator tools (edit arguments and retry) only for users who may retry."""
        fieldsets = super().get_fieldsets(request, obj)
        if self.has_retry_permission(request):
            return fieldsets
        return [
            (name, {**opts, "fields": tuple(f for f in opts["fields"] if f != "operator_tools")})
            for name, opts in fieldsets
        ]

    def get_urls(self) -> list[URLPattern]:
        def wrap(view: Any) -> Any:
            return self.admin_site.admin_view(view)

        own = [
            path(
                "dead/",
                wrap(DeadJobsView.as_view(model_admin=self)),
                name="django_gator_job_dead",
            ),
            path(
                "dashboard/",
                wrap(DashboardView.as_view(model_admin=self)),
                name="django_gator_job_dashboard",
            ),
            path(
                "dashboard/queues/",
                wrap(QueuePauseView.as_view(model_admin=self)),
                name="django_gator_job_pause_queue",
            ),
            path(
                "dashboard/limits/",
                wrap(QueueLimitsView.as_view(model_admin=self)),
                name="django_gator_job_queue_limits",
            ),
            path(
                "<path:object_id>/edit-arguments/",
                wrap(EditArgumentsView.as_view(model_admin=self)),
                name="django_gator_job_edit_arguments",
            ),
            path("<path:object_id>/retry/", wrap(self.retry_view), name="django_gator_job_retry"),
            path(
                "<path:object_id>/clear-checkpoint/",
                wrap(self.clear_checkpoint_view),
                name="django_gator_job_clear_checkpoint",
            ),
            path(
                "batches/<int:batch_id>/",
                wrap(BatchView.as_view(model_admin=self)),
                name="django_gator_job_batch",
            ),
        ]
        return own + super().get_urls()

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The Retry button of a job's page: a POST (CSRF-checked by admin_view) that needs
        the retry permission and runs the job list's retry action on this one job."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_retry_permission(request):
            raise PermissionDenied
        job = get_object_or_404(self.get_queryset(request), pk=object_id)
        self.retry_and_report(request, self.get_queryset(request).filter(pk=job.pk))
        wrote(request)
        return HttpResponseRedirect(
            job_url(reverse("admin:django_gator_job_change", args=[job.pk]), job)
        )

    @staticmethod
    def _secrets(job: Job) -> list[str]:
        cache = job.__dict__.setdefault("_gator_secrets", {})
        if "values" not in cache:
            cache["values"] = redaction.job_secret_values(job.name, job.args, job.kwargs, job.audit)
        return list(cache["values"])

    created = time_field("created_at", "created at")
    next_execution = time_field("next_execution_at", "next execution at")
    started = time_field("started_at", "started at")
    locked = time_field("locked_at", "locked at (last claim)")
    finished = time_field("finished_at", "finished at")

    @admin.display(description="next run", ordering="next_execution_at")
    def next_run(self, job: Job) -> SafeString | None:
        """When the job is due; under it, how many times it snoozed, if it did, a running
        job's progress bar, and for a job running longer than ``GATOR_LONG_RUNNING_AFTER``
        (since its claim, by this server's clock) a flag with its age (in the same cell:
        the list has no room for another column). A job that never ends shows here."""
        shown = when(job.next_execution_at)
        if job.snoozes:
            shown = format_html(
                '{}<br><span class="snoozes" title="{}">{}</span>',
                shown or "-",
                "times handle() raised Snooze (no attempt counted)",
                wording.count(job.snoozes, "snooze"),
            )
        shown = self.with_progress(job, shown)
        age = running_for(job)
        if age is None or age <= conf.long_running_after():
            return shown
        title = "running longer than GATOR_LONG_RUNNING_AFTER"
        if job.handbacks:
            title += f"; handed back by stopping workers {wording.count(job.handbacks, 'time')}"
        return format_html(
            '{}<br><strong class="gator-long-running" title="{}">{} {}</strong>',
            shown or "-",
            title,
            "running for",
            wording.age(age),
        )

    @admin.display(description="name", ordering="name")
    def job_name(self, job: Job) -> SafeString:
        """The job name, allowed to wrap after each dot (a dotted path has no other place
        to break, and would widen the list by itself)."""
        *module, last = job.name.split(".")
        return format_html_join("", "{}.<wbr>", ((part,) for part in module)) + format_html(
            "{}", last
        )

    @admin.display(description="last error")
    def error_summary(self, job: Job) -> SafeString | None:
        """The start of the last error of a failed, dead or cancelled job; the whole of it
        (masked, up to 500 characters) is the tooltip."""
        if job.state not in ERROR_STATES or not job.last_error:
            return None
        text = redaction.mask_text(job.last_error, self._secrets(job))
        return format_html(
            '<span title="{}">{}</span>',
            Truncator(text).chars(500),
            Truncator(text).chars(LIST_ERROR_CHARS),
        )

    @admin.display(description="last error")
    def last_error_shown(self, job: Job) -> str:
        text = redaction.mask_text(job.last_error, self._secrets(job))
        if job.state in ERROR_STATES or not text:
            return text
        state = job.get_state_display().lower()
        return f"None now ({state}); the errors of earlier attempts are in the error history."

    @admin.display(description="args")
    def args_pretty(self, job: Job) -> SafeString:
        return pretty(redaction.redact_payload(job.name, job.args, job.kwargs)[0])

    @admin.display(description="kwargs")
    def kwargs_pretty(self, job: Job) -> SafeString:
        return pretty(redaction.redact_payload(job.name, job.args, job.kwargs)[1])

    @admin.display(description="result")
    def result_pretty(self, job: Job) -> SafeString:
        return pretty(redaction.redact_value(job.result, redaction.keys_for(job.name)))

    @admin.display(description="tools")
    def operator_tools(self, job: Job) -> SafeString:
        """Retry (a POST of the page's own form, with its CSRF token, to the retry view) and
        the argument editor; shown only to users who may retry (see get_fieldsets)."""
        if job.state not in (JobState.DEAD, JobState.FAILED):
            return format_html("<p>{}</p>", "Only dead and failed jobs can be retried or edited.")
        edit = reverse("admin:django_gator_job_edit_arguments", args=[job.pk])
        retry = job_url(reverse("admin:django_gator_job_retry", args=[job.pk]), job)
        button = '<button type="submit" class="button default gator-retry" formmethod="post" '
        if retry != reverse("admin:django_gator_job_retry", args=[job.pk]):  # another database's
            return format_html(button + 'formaction="{}">{}</button>', retry, "Retry")
        tools = format_html(
            button + 'formaction="{}">{}</button> <a class="button" href="{}">{}</a>',
            retry,
            "Retry",
            edit,
            "Edit arguments and retry",
        )
        last_edit = last_restorable_edit(job)
        if last_edit is not None:
            tools += format_html(
                ' <a class="button gator-undo-edit" href="{}?restore={}">{}</a>',
                edit,
                last_edit,
                "Undo the last argument edit",
            )
        return tools

    @admin.display(description="errors, oldest first")
    def error_history_html(self, job: Job) -> SafeString:
        secrets = self._secrets(job)
        entries = [
            {
                **e,
                "message": redaction.mask_text(str(e.get("message", "")), secrets),
                "traceback": redaction.mask_text(str(e.get("traceback", "")), secrets),
            }
            for e in job.error_history
        ]
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
