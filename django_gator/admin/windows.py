"""The JobAdmin's key and expiry fields: which unique key a job holds, under which window
(``unique_for``, ``debounce``, ``throttle``) and until when; when it expires, or that it
expired (see :mod:`django_gator.windows` and :mod:`django_gator.expiry`); the tenant a job
of a fair queue is counted under, and its stamp (docs/fairness.md)."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin
from django.utils.html import format_html
from django.utils.safestring import SafeString

from django_gator import wording
from django_gator.admin.display import when
from django_gator.expiry import EXPIRED_CLASS
from django_gator.models import FINAL_STATES, Job, JobState
from django_gator.registry import registered_jobs
from django_gator.windows import Window


class WindowDisplay(admin.ModelAdmin):
    """Read-only fields of the job page: ``key_window``, ``fairness`` and ``expiry``."""

    @admin.display(description="fairness key")
    def fairness(self, job: Job) -> SafeString | str:
        if job.fair_order is None:
            return "-"
        key = job.fairness_key
        shown = format_html("<code>{}</code>", key) if key else "the queue's keyless tenant"
        return format_html(
            "{} in the fair queue {} (stamp {}: claimed by priority, then stamp)",
            shown,
            job.queue,
            f"{job.fair_order:.3f}",
        )

    @admin.display(description="unique key")
    def key_window(self, job: Job) -> SafeString | str:
        key = job.dedupe_key or job.unique_key
        if key is None:
            return "-"
        job_class = registered_jobs().get(job.name)
        window = job_class.traits.window if job_class is not None else None
        if window is None:
            return format_html(
                "<code>{}</code>: held while the job is waiting, failed or running", key
            )
        return format_html("<code>{}</code>: {}", key, _window_text(job, window))

    @admin.display(description="expires at")
    def expiry(self, job: Job) -> SafeString | str:
        if job.expires_at is None:
            return "-"
        shown = when(job.expires_at)
        if job.error_class == EXPIRED_CLASS and job.state == JobState.CANCELLED:
            return format_html("{} <strong>expired: never run</strong>", shown)
        return format_html("{} (not started by then, it never runs)", shown)


def _window_text(job: Job, window: Window) -> SafeString:
    """What the key's window means for this job, with the time it ends where one is known."""
    length = wording.age(window.seconds)
    span = timedelta(seconds=window.seconds)
    if window.kind == "unique_for":
        if job.state in FINAL_STATES and job.finished_at is not None:
            return format_html(
                "taken until {} (unique_for {} after the job finished)",
                when(job.finished_at + span),
                length,
            )
        return format_html(
            "taken while the job is active, then for {} after it finishes (unique_for)", length
        )
    if job.state == JobState.WAITING:
        verb = "replace its arguments" if window.kind == "debounce" else "join it"
        return format_html(
            "dispatches of the key {} until it starts, at {} ({} {})",
            verb,
            when(job.next_execution_at),
            window.kind,
            length,
        )
    if window.kind == "throttle" and job.started_at is not None:
        return format_html(
            "the next job of the key starts no sooner than {} (throttle {})",
            when(job.started_at + span),
            length,
        )
    return format_html("{} {} (a later dispatch waits beside this job)", window.kind, length)
