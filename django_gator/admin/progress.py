"""Long-running jobs in the admin: a running job's progress (a bar, its note, rate and ETA)
in the job list and on its page, its checkpoint (redacted like its arguments), the log lines
each attempt captured (redacted like its errors), and the "Clear checkpoint" button: a POST
with the page's CSRF token, behind the retry permission, recorded in the job's audit
trail."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from django_gator import conf, redaction, wording
from django_gator.admin.display import pretty
from django_gator.admin.pages import RETRY_PERMISSION, username
from django_gator.admin.sealed import open_for
from django_gator.models import Job, JobState, record
from django_gator.progress_figures import number_text, progress_parts, progress_text

#: The audit trail's name for the clear-checkpoint action.
CLEAR_ACTION = "clear checkpoint"


def progress_bar(parts: dict[str, Any]) -> SafeString:
    """A ``<progress>`` bar (indeterminate without a total) and the figures."""
    if parts["percent"] is None:
        bar = format_html('<progress class="gator-progress" title="{}"></progress>', parts["note"])
    else:
        bar = format_html(
            '<progress class="gator-progress" max="100" value="{}" title="{}"></progress>',
            f"{parts['percent']:.1f}",
            parts["note"],
        )
    return format_html('{} <span class="gator-progress-text">{}</span>', bar, progress_text(parts))


class ProgressDisplay(admin.ModelAdmin):
    """The JobAdmin's long-running-job fields and the clear-checkpoint view."""

    @staticmethod
    def with_progress(job: Job, shown: SafeString | None) -> SafeString | None:
        """``shown`` (a cell of the job list) with, under it, the progress bar of a running
        job that reports progress (the list has no room for a column of its own)."""
        parts = progress_parts(job.progress) if job.state == JobState.RUNNING else None
        if parts is None:
            return shown
        return format_html("{}<br>{}", shown or "-", progress_bar(parts))

    @admin.display(description="progress")
    def progress_html(self, job: Job) -> SafeString:
        """The last progress of the job's run: bar, note, rate, ETA and when it came."""
        parts = progress_parts(job.progress)
        if parts is None:
            return format_html("<p>{}</p>", "No progress reported.")
        details = []
        if parts["note"]:
            details.append(parts["note"])
        if parts["rate"]:
            details.append(f"{number_text(parts['rate'])} per second")
        if parts["eta"] is not None and job.state == JobState.RUNNING:
            details.append(f"about {wording.age(parts['eta'])} left")
        if parts["at"]:
            details.append(f"reported at {parts['at']}")
        return format_html(
            '<p>{}</p><p class="gator-progress-details">{}</p>',
            progress_bar(parts),
            " · ".join(details),
        )

    @admin.display(description="checkpoint")
    def checkpoint_html(self, job: Job) -> SafeString:
        """The checkpoint the next attempt resumes from (redacted as the arguments are),
        and, for users who may retry, the button that clears it."""
        if job.checkpoint_data is None:
            return format_html("<p>{}</p>", "None: the next attempt starts from scratch.")
        shown = pretty(redaction.redact_value(job.checkpoint_data, redaction.keys_for(job.name)))
        if job.state == JobState.RUNNING or not getattr(job, "_gator_may_clear", False):
            return shown
        return shown + format_html(
            '<button type="submit" class="button gator-clear-checkpoint" formmethod="post" '
            'formaction="{}">{}</button>',
            reverse("admin:django_gator_job_clear_checkpoint", args=[job.pk]),
            "Clear checkpoint (restart from scratch)",
        )

    @admin.display(description="captured logs, oldest attempt first")
    def logs_html(self, job: Job) -> SafeString:
        """Each attempt's captured log lines (see ``log_level``), apart, the job's
        redacted values masked; the last attempt's open."""
        entries = job.logs()
        if not entries:
            return format_html("<p>{}</p>", "No log lines captured.")
        return format_html_join(
            "\n",
            '<details class="gator-logs"{}><summary>Attempt {} &middot; {} &middot; {} lines'
            "{} &middot; from {} &middot; worker {}</summary><pre>{}</pre></details>",
            (
                (
                    " open" if number == len(entries) else "",
                    e.get("attempt", "?"),
                    e.get("at", ""),
                    len(e["lines"]),
                    f" ({e['dropped']} older dropped)" if e.get("dropped") else "",
                    e.get("level", ""),
                    e.get("worker", ""),
                    "\n".join(e["lines"]) or "(none)",
                )
                for number, e in enumerate(entries, 1)
            ),
        )

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        """The job of a page, told whether this user may clear its checkpoint, its
        encrypted data decrypted or hidden (see :mod:`.sealed`)."""
        job = super().get_object(request, object_id, from_field)
        if job is not None:
            job._gator_may_clear = request.user.has_perm(RETRY_PERMISSION)
            open_for(request, job)
        return job

    def clear_checkpoint_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Clear a job's checkpoint, so that its next attempt starts from scratch: a POST
        (CSRF-checked by admin_view) that needs the retry permission; refused while the
        job runs (its runner would write a new one)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not request.user.has_perm(RETRY_PERMISSION):
            raise PermissionDenied
        job = get_object_or_404(Job, pk=object_id)
        alias = conf.database()
        with transaction.atomic(using=alias):
            cleared = (
                Job.objects.using(alias)
                .filter(pk=job.pk, checkpoint_data__isnull=False)
                .exclude(state=JobState.RUNNING)
                .update(checkpoint_data=None)
            )
            if cleared:
                record(alias, [job.pk], CLEAR_ACTION, username(request))
        if cleared:
            messages.success(request, "Checkpoint cleared: the next attempt starts from scratch.")
        else:
            messages.warning(request, "Nothing cleared: the job is running or has no checkpoint.")
        return HttpResponseRedirect(reverse("admin:django_gator_job_change", args=[job.pk]))
