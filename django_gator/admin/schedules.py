"""The schedule admin: schedules declared here run like those declared in code or settings.

The form refuses what a worker would: an invalid cron expression or time zone, a job name
not in the registry, arguments its handler would not take. Schedules declared in code or
settings are rewritten by each worker at start-up, so only their ``enabled`` switch is
editable here. "Run now" needs the ``run_schedule`` permission.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest

from django_gator import schedules
from django_gator.models import Schedule, ScheduleSource
from django_gator.payload import encode_payload
from django_gator.queueable import get_job_class, registered_jobs
from django_gator.validation import validate_queue


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
