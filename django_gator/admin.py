"""The Job admin: a read-only browser of jobs; changes happen through permissioned actions.

Admin actions are POST requests with Django's CSRF protection, each behind a confirmation
page. Retrying needs the ``django_gator.retry_job`` permission and cancelling
``django_gator.cancel_job``; deleting needs the usual delete permission. The dead-job screen
and the dashboard live in :mod:`django_gator.admin_views`. Argument values named by
``GATOR_REDACT`` are masked on every page.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import TextField
from django.db.models.functions import Cast
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from django_gator import admin_views, redaction, schedules
from django_gator.models import Job, JobQuerySet, JobState, Schedule, ScheduleSource, Worker
from django_gator.queueable import get_job_class, registered_jobs
from django_gator.validation import encode_payload, validate_queue

#: The states in which a job's last error says why it is where it is; a job that succeeded
#: (or waits or runs again) after a failed attempt keeps that error in its history only.
ERROR_STATES = (JobState.FAILED, JobState.DEAD, JobState.CANCELLED)
#: Characters of the last error shown in the job list (the full text is its tooltip).
LIST_ERROR_CHARS = 40


def _pretty(value: Any) -> SafeString:
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    return format_html('<pre class="gator-json">{}</pre>', text)


def when(value: datetime | None) -> SafeString | None:
    """A time to the second in the current time zone (the admin's), with its full ISO 8601
    form as the tooltip; None (the admin's "-") when there is none."""
    if value is None:
        return None
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    # The date and the time may go on two lines (the job list is narrow), each unbroken.
    return format_html(
        '<time datetime="{}" title="{}"><span class="nowrap">{}</span> '
        '<span class="nowrap">{}</span></time>',
        value.isoformat(),
        local.isoformat(),
        local.strftime("%Y-%m-%d"),
        local.strftime("%H:%M:%S"),
    )


def _time_field(field: str, description: str) -> Any:
    """A read-only admin field showing the model's datetime ``field`` to the second."""

    @admin.display(description=description, ordering=field)
    def show(self: Any, obj: Any) -> SafeString | None:
        return when(getattr(obj, field))

    return show


class EstimatedCountPaginator(Paginator):
    """Counts the unfiltered job list from the database's row estimate (a COUNT(*) of
    millions of rows costs seconds on PostgreSQL); filtered lists are counted exactly."""

    @cached_property
    def count(self) -> int:
        query = getattr(self.object_list, "query", None)
        if query is not None and not query.where:
            from django_gator import stats

            total, _exact = stats.estimated_total(getattr(self.object_list, "db", None))
            return total
        return super().count


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
    """Queues with unfinished or dead jobs: a skip scan of the claim index plus the few
    running, failed and dead rows (Django's default filter reads every row for DISTINCT)."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        from django_gator import conf
        from django_gator.engines import get_engine

        names = set(get_engine(conf.database()).ready_queues())
        names.update(
            Job.objects.filter(state__in=(JobState.RUNNING, JobState.FAILED, JobState.DEAD))
            .order_by()
            .values_list("queue", flat=True)
            .distinct()
        )
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        return queryset.filter(queue=value) if value else queryset


class ErrorClassFilter(admin.SimpleListFilter):
    """Error classes of the dead and failed jobs."""

    title = "error class"
    parameter_name = "error_class"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in admin_views.error_class_choices()]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        return queryset.filter(error_class=value) if value else queryset


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    paginator = EstimatedCountPaginator
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
        "state",
        QueueFilter,
        JobNameFilter,
        ErrorClassFilter,
        "created_at",
        "finished_at",
    )
    search_fields = ("=id", "name", "last_error")
    search_help_text = "Search by id, job name, error text or argument text."
    date_hierarchy = None
    list_per_page = 50
    show_full_result_count = False
    ordering = ("-id",)
    actions = ("retry_jobs", "cancel_jobs", "delete_selected")
    fieldsets = (
        (None, {"fields": ("id", "name", "state", "queue", "priority")}),
        ("Payload", {"fields": ("args_pretty", "kwargs_pretty", "result_pretty")}),
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
            {"fields": ("attempts", "rescues", "reserved_by", "error_class", "last_error_shown")},
        ),
        ("Error history", {"fields": ("error_history_html",)}),
        ("Operator actions", {"fields": ("operator_tools", "audit_html")}),
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
        "created",
        "next_execution",
        "started",
        "locked",
        "finished",
        "attempts",
        "rescues",
        "reserved_by",
        "error_class",
        "last_error_shown",
        "error_history_html",
        "operator_tools",
        "audit_html",
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
            path("dead/", wrap(self.dead_jobs_view), name="django_gator_job_dead"),
            path("dashboard/", wrap(self.dashboard_view), name="django_gator_job_dashboard"),
            path(
                "<path:object_id>/edit-arguments/",
                wrap(self.edit_arguments_view),
                name="django_gator_job_edit_arguments",
            ),
            path("<path:object_id>/retry/", wrap(self.retry_view), name="django_gator_job_retry"),
        ]
        return own + super().get_urls()

    def dead_jobs_view(self, request: HttpRequest) -> HttpResponse:
        return admin_views.dead_jobs(self, request)

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        return admin_views.dashboard(self, request)

    def edit_arguments_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return admin_views.edit_arguments(self, request, object_id)

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The Retry button of a job's page: a POST (CSRF-checked by admin_view) that needs
        the retry permission and runs the job list's retry action on this one job."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_retry_permission(request):
            raise PermissionDenied
        job = get_object_or_404(Job, pk=object_id)
        self.retry_and_report(request, Job.objects.filter(pk=job.pk))
        return HttpResponseRedirect(reverse("admin:django_gator_job_change", args=[job.pk]))

    def get_search_results(self, request: HttpRequest, queryset: Any, search_term: str) -> Any:
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        if search_term and not search_term.strip().isdigit():
            by_args = queryset.annotate(_args_text=Cast("args", TextField())).filter(
                _args_text__icontains=search_term.strip()
            )
            results = results | by_args.values_list("pk", flat=True).model.objects.filter(
                pk__in=by_args.values("pk")
            )
        return results, may_have_duplicates

    @staticmethod
    def _secrets(job: Job) -> list[str]:
        cache = job.__dict__.setdefault("_gator_secrets", {})
        if "values" not in cache:
            cache["values"] = redaction.job_secret_values(job.name, job.args, job.kwargs, job.audit)
        return list(cache["values"])

    created = _time_field("created_at", "created at")
    next_execution = _time_field("next_execution_at", "next execution at")
    started = _time_field("started_at", "started at")
    locked = _time_field("locked_at", "locked at (last claim)")
    finished = _time_field("finished_at", "finished at")
    next_run = _time_field("next_execution_at", "next run")

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
        return _pretty(redaction.redact_payload(job.name, job.args, job.kwargs)[0])

    @admin.display(description="kwargs")
    def kwargs_pretty(self, job: Job) -> SafeString:
        return _pretty(redaction.redact_payload(job.name, job.args, job.kwargs)[1])

    @admin.display(description="result")
    def result_pretty(self, job: Job) -> SafeString:
        return _pretty(redaction.redact_value(job.result, redaction.keys_for(job.name)))

    @admin.display(description="tools")
    def operator_tools(self, job: Job) -> SafeString:
        """Retry (a POST of the page's own form, with its CSRF token, to the retry view) and
        the argument editor; shown only to users who may retry (see get_fieldsets)."""
        if job.state not in (JobState.DEAD, JobState.FAILED):
            return format_html("<p>{}</p>", "Only dead and failed jobs can be retried or edited.")
        edit = reverse("admin:django_gator_job_edit_arguments", args=[job.pk])
        tools = format_html(
            '<button type="submit" class="button default gator-retry" formmethod="post" '
            'formaction="{}">{}</button> <a class="button" href="{}">{}</a>',
            reverse("admin:django_gator_job_retry", args=[job.pk]),
            "Retry",
            edit,
            "Edit arguments and retry",
        )
        last_edit = admin_views.last_restorable_edit(job)
        if last_edit is not None:
            tools += format_html(
                ' <a class="button gator-undo-edit" href="{}?restore={}">{}</a>',
                edit,
                last_edit,
                "Undo the last argument edit",
            )
        return tools

    @admin.display(description="audit trail")
    def audit_html(self, job: Job) -> SafeString:
        """Who did what when; an argument edit also shows the values before and after it,
        redacted as the payload is."""
        entries = [e for e in job.audit or [] if isinstance(e, dict)]
        if not entries:
            return format_html("<p>{}</p>", "No operator action yet.")
        shown = []
        for e in entries:
            line = format_html(
                "<p>{} &middot; {} by <b>{}</b>{}</p>",
                e.get("at", ""),
                e.get("action", ""),
                e.get("by", "?"),
                f" (onto queue {e['queue']})" if e.get("queue") else "",
            )
            if e.get("action") == admin_views.EDIT_ACTION and isinstance(e.get("before"), dict):
                line += self._edit_values(job, e["before"], e.get("after"))
            shown.append((line,))
        return format_html_join("\n", "{}", shown)

    @staticmethod
    def _edit_values(job: Job, before: dict[str, Any], after: Any) -> SafeString:
        after = after if isinstance(after, dict) else {}
        old = redaction.redact_payload(job.name, before.get("args"), before.get("kwargs"))
        new = redaction.redact_payload(job.name, after.get("args"), after.get("kwargs"))
        return format_html(
            '<table class="gator-edit"><thead><tr><th></th><th>{}</th><th>{}</th></tr></thead>'
            "<tbody><tr><th>args</th><td>{}</td><td>{}</td></tr>"
            "<tr><th>kwargs</th><td>{}</td><td>{}</td></tr></tbody></table>",
            "before",
            "after",
            _pretty(old[0]),
            _pretty(new[0]),
            _pretty(old[1]),
            _pretty(new[1]),
        )

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

    def _confirm(
        self, request: HttpRequest, queryset: JobQuerySet, action: str, question: str
    ) -> TemplateResponse | None:
        """The confirmation page of a bulk action, or None once it was confirmed."""
        if request.POST.get("post") == "yes":
            return None
        ids = list(queryset.values_list("pk", flat=True)[:10_000])
        context = {
            **self.admin_site.each_context(request),
            **admin_views.breadcrumbs(self, "Are you sure?"),
            "opts": self.model._meta,
            "title": "Are you sure?",
            "question": question.format(count=len(ids)),
            "jobs": list(queryset.order_by("-id")[:20]),
            "more": max(len(ids) - 20, 0),
            "ids": ids,
            "action": action,
        }
        return TemplateResponse(request, "admin/django_gator/job/confirm_action.html", context)

    @admin.action(description="Retry the selected dead or failed jobs now", permissions=["retry"])
    def retry_jobs(self, request: HttpRequest, queryset: JobQuerySet) -> TemplateResponse | None:
        confirm = self._confirm(
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
        changed = queryset.retry(by=request.user.get_username(), queue=queue)
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
        confirm = self._confirm(
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


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ("id", "hostname", "pid", "queue_list", "concurrency", "started", "heartbeat")
    fields = readonly_fields = list_display

    started = _time_field("started_at", "started at")
    heartbeat = _time_field("heartbeat_at", "heartbeat at")

    @admin.display(description="queues")
    def queue_list(self, worker: Worker) -> str:
        """The queues and their weights as words, not as the stored JSON."""
        return admin_views.describe_queues(worker.queues)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ScheduleForm(forms.ModelForm):
    """Validates what the worker would refuse: the cron expression, the job name (only
    registered jobs), the time zone and the arguments."""

    job_name = forms.ChoiceField(choices=())

    class Meta:
        model = Schedule
        fields = (
            "name",
            "job_name",
            "cron",
            "timezone",
            "args",
            "kwargs",
            "queue",
            "priority",
            "enabled",
            "misfire",
            "catch_up_limit",
            "overlap",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = sorted(registered_jobs())
        current = self.initial.get("job_name")
        if current and current not in names:
            names.append(current)  # shown, and refused on save (see clean_job_name)
        self.fields["job_name"].choices = [(n, n) for n in names]  # type: ignore[attr-defined]

    def clean_cron(self) -> str:
        return self._check(schedules.validate_cron, self.cleaned_data["cron"])

    def clean_timezone(self) -> str:
        return self._check(schedules.validate_timezone, self.cleaned_data["timezone"])

    def clean_job_name(self) -> str:
        name = self.cleaned_data["job_name"]
        self._check(get_job_class, name)
        return str(name)

    def clean_queue(self) -> str:
        queue = self.cleaned_data.get("queue") or ""
        if queue:
            self._check(validate_queue, queue)
        return queue

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        name, args, kwargs = data.get("job_name"), data.get("args"), data.get("kwargs")
        if name and not self.errors.get("job_name"):
            if not isinstance(args, list):
                self.add_error("args", f"must be a JSON list, got {args!r}")
            elif not isinstance(kwargs, dict):
                self.add_error("kwargs", f"must be a JSON object, got {kwargs!r}")
            else:
                try:
                    get_job_class(name).check_arguments(args, kwargs)
                    encode_payload(args, kwargs)
                except (TypeError, ValueError) as exc:
                    self.add_error("args", str(exc))
        return data

    @staticmethod
    def _check(func: Any, value: Any) -> Any:
        try:
            func(value)
        except (LookupError, TypeError, ValueError) as exc:
            raise forms.ValidationError(str(exc)) from None
        return value


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm
    list_display = (
        "name",
        "job_name",
        "cron",
        "timezone",
        "enabled",
        "misfire",
        "overlap",
        "last_run_at",
        "next_run_at",
        "source",
    )
    list_filter = ("enabled", "source", "misfire")
    search_fields = ("name", "job_name")
    readonly_fields = ("source", "last_run_at", "next_run_at", "last_job_id", "anchor_at")
    actions = ("run_now",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None and obj.source != ScheduleSource.ADMIN:
            # Declared in code or settings: each worker writes them at start-up.
            return [f for f in ScheduleForm.Meta.fields if f != "enabled"] + list(
                self.readonly_fields
            )
        return self.readonly_fields

    def has_run_permission(self, request: HttpRequest) -> bool:
        opts = self.opts
        return bool(request.user.has_perm(f"{opts.app_label}.run_schedule"))

    @admin.action(description="Run the selected schedules' jobs now", permissions=["run"])
    def run_now(self, request: HttpRequest, queryset: Any) -> None:
        dispatched = []
        for schedule in queryset:
            try:
                job_class = get_job_class(schedule.job_name)
                job = job_class.dispatch(
                    *schedule.args,
                    queue=schedule.queue or None,
                    priority=schedule.priority,
                    **schedule.kwargs,
                )
            except (LookupError, TypeError, ValueError) as exc:
                self.message_user(request, f"{schedule.name}: {exc}", messages.ERROR)
                continue
            dispatched.append(f"{schedule.name} (job #{job.pk})")
        if dispatched:
            self.message_user(
                request, "Dispatched: " + ", ".join(dispatched) + ".", messages.SUCCESS
            )


__all__ = ["JobAdmin", "JobState", "ScheduleAdmin", "WorkerAdmin"]
