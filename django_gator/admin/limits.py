"""The dashboard's Limits page: an operator sets a queue's concurrency and rate limits
(``django_gator.change_queue``, POST with CSRF), recorded with who and when on the queue's
row. The limits then override ``GATOR_QUEUES`` for that queue, and take effect at every
worker's next claim; "Use the settings" gives the queue back to ``GATOR_QUEUES``."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from django_gator import conf
from django_gator.admin.pages import AdminPage, username
from django_gator.limits import LIMIT_MAX, parse_rate, validate_concurrency
from django_gator.models import Queue
from django_gator.validation import QUEUE_MAX_LENGTH, validate_queue

#: The permission to change a queue's limits.
LIMITS_PERMISSION = "django_gator.change_queue"


class LimitsForm(forms.Form):
    queue = forms.CharField(max_length=QUEUE_MAX_LENGTH)
    concurrency = forms.IntegerField(
        required=False,
        help_text=f"At most this many of its jobs run at once (1 to {LIMIT_MAX}; empty: none).",
    )
    rate_limit = forms.CharField(
        required=False,
        max_length=20,
        help_text='At most this many start per window: "10/s", "100/m", "1000/h" (empty: none).',
    )

    def clean_queue(self) -> str:
        try:
            return validate_queue(self.cleaned_data["queue"].strip())
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_concurrency(self) -> int | None:
        try:
            return validate_concurrency(self.cleaned_data["concurrency"])
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_rate_limit(self) -> str:
        try:
            rate = parse_rate(self.cleaned_data["rate_limit"].strip())
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
        return "" if rate is None else str(rate)


class QueueLimitsView(AdminPage):
    """``admin:django_gator_job_queue_limits``: GET the form (``?queue=NAME`` fills it in
    from the queue's row); POST ``queue``, ``concurrency``, ``rate_limit`` to set them, or
    with ``use_settings`` to give the queue back to ``GATOR_QUEUES``."""

    template_name = "admin/django_gator/job/queue_limits.html"

    def get(self, request: HttpRequest) -> HttpResponse:
        name = request.GET.get("queue", "")
        row = Queue.objects.using(conf.database()).filter(name=name).first()
        initial: dict[str, Any] = {"queue": name}
        if row is not None:
            initial.update(concurrency=row.concurrency, rate_limit=row.rate_limit)
        return self._page(LimitsForm(initial=initial), row)

    def post(self, request: HttpRequest) -> HttpResponse:
        if not request.user.has_perm(LIMITS_PERMISSION):
            raise PermissionDenied
        form = LimitsForm(request.POST)
        if not form.is_valid():
            return self._page(form, None)
        name = form.cleaned_data["queue"]
        queues = Queue.objects.using(conf.database())
        if "use_settings" in request.POST:
            queues.use_settings(name, conf.queues(), by=username(request))
            messages.success(request, f"Queue {name} follows GATOR_QUEUES again.")
        else:
            queues.set_limits(
                name,
                concurrency=form.cleaned_data["concurrency"],
                rate_limit=form.cleaned_data["rate_limit"],
                by=username(request),
            )
            messages.success(
                request,
                f"Queue {name}'s limits saved; every worker applies them at its next claim.",
            )
        return HttpResponseRedirect(reverse("admin:django_gator_job_dashboard"))

    def _page(self, form: LimitsForm, row: Queue | None) -> HttpResponse:
        context = {
            **self.context(
                "Queue limits",
                (reverse("admin:django_gator_job_dashboard"), "Job dashboard"),
            ),
            "form": form,
            "row": row,
            "can_change": self.request.user.has_perm(LIMITS_PERMISSION),
        }
        return self.render(context)
