"""The job admin's own pages: the dead-job screen and editing a dead job's arguments.

Every page needs the job view permission; every change is a POST (CSRF-protected by the
admin) that checks its own permission (``retry_job`` to retry or edit, ``cancel_job`` to
discard) and is recorded in the jobs' audit trail with the user's name. Bulk changes go
through a confirmation page that says how many jobs they touch.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import django
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Max, Q
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.text import Truncator, capfirst
from django.utils.translation import gettext as _

from django_gator import redaction, validation
from django_gator.exceptions import JobNotRegistered
from django_gator.models import Job, JobQuerySet, JobState, record
from django_gator.queueable import get_job_class

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

#: The states the dead-job screen shows: "dead", "failed" (retry pending) or both.
SCREEN_STATES = {
    "dead": (JobState.DEAD,),
    "failed": (JobState.FAILED,),
    "both": (JobState.DEAD, JobState.FAILED),
}
MAX_GROUPS = 200


#: Django 6.1 made the admin's breadcrumbs an <ol> of <li> (ticket #34041) and styles only
#: ``ol.breadcrumbs``; up to 6.0 they are a <div> with &rsaquo; between the links.
BREADCRUMBS_OL = django.VERSION >= (6, 1)


def breadcrumbs(model_admin: ModelAdmin, current: str, *between: tuple[str, str]) -> dict[str, Any]:
    """The context of ``admin/django_gator/breadcrumbs.html``: Home, the app, the job list,
    the ``(url, label)`` pairs ``between``, then ``current`` (this page), rendered in the
    markup of the installed Django line, as Django's own pages render theirs."""
    opts = model_admin.model._meta
    site = model_admin.admin_site.name
    trail = [
        (reverse(f"{site}:index"), _("Home")),
        (
            reverse(f"{site}:app_list", kwargs={"app_label": opts.app_label}),
            opts.app_config.verbose_name,
        ),
        (
            reverse(f"{site}:{opts.app_label}_{opts.model_name}_changelist"),
            capfirst(opts.verbose_name_plural),
        ),
        *between,
        ("", current),
    ]
    return {"gator_breadcrumbs": trail, "gator_breadcrumbs_ol": BREADCRUMBS_OL}


def _context(
    model_admin: ModelAdmin,
    request: HttpRequest,
    title: str,
    *between: tuple[str, str],
    crumb: str | None = None,
) -> dict[str, Any]:
    """The admin's context for one of our pages; its breadcrumbs end with ``between`` and
    ``crumb`` (default: the title)."""
    return {
        **model_admin.admin_site.each_context(request),
        **breadcrumbs(model_admin, crumb or title, *between),
        "opts": model_admin.model._meta,
        "title": title,
        "has_view_permission": True,
    }


def _username(request: HttpRequest) -> str:
    return str(request.user.get_username())


def _filters(data: Any) -> dict[str, str]:
    """The screen's filters from GET or POST data, as strings ('' when absent)."""
    state = data.get("state", "dead")
    return {
        "state": state if state in SCREEN_STATES else "dead",
        "name": str(data.get("name", "")),
        "error_class": str(data.get("error_class", "")),
        "queue": str(data.get("queue", "")),
    }


def _matching(filters: dict[str, str]) -> JobQuerySet:
    jobs = Job.objects.filter(state__in=SCREEN_STATES[filters["state"]])
    if filters["name"]:
        jobs = jobs.filter(name=filters["name"])
    if filters["error_class"]:
        jobs = jobs.filter(error_class=filters["error_class"])
    if filters["queue"]:
        jobs = jobs.filter(queue=filters["queue"])
    return jobs


def dead_jobs(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """Dead (and failed) jobs grouped by job name and error class."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    if request.method == "POST":
        return _dead_jobs_post(model_admin, request)
    filters = _filters(request.GET)
    jobs = _matching(filters)
    groups: list[dict[str, Any]] = [
        dict(group)
        for group in jobs.values("name", "error_class")
        .annotate(count=Count("id"), newest=Max("id"))
        .order_by("-count", "name", "error_class")[:MAX_GROUPS]
    ]
    newest = Job.objects.in_bulk([g["newest"] for g in groups])
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
        group["jobs_url"] = f"{changelist}?{urlencode(query)}"
    context = {
        **_context(model_admin, request, "Dead jobs"),
        "filters": filters,
        "states": list(SCREEN_STATES),
        "groups": groups,
        "total": jobs.count(),
        "truncated": len(groups) == MAX_GROUPS,
        "can_retry": request.user.has_perm("django_gator.retry_job"),
        "can_discard": request.user.has_perm("django_gator.cancel_job"),
        "names": sorted(
            jobs.order_by().values_list("name", flat=True).distinct()[:500]
            if not filters["name"]
            else [filters["name"]]
        ),
    }
    return TemplateResponse(request, "admin/django_gator/job/dead_jobs.html", context)


def _dead_jobs_post(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    action = request.POST.get("action", "")
    filters = _filters(request.POST)
    here = (
        reverse("admin:django_gator_job_dead")
        + "?"
        + urlencode({k: v for k, v in _filters(request.POST).items() if k == "state"})
    )
    if action == "retry":
        if not request.user.has_perm("django_gator.retry_job"):
            raise PermissionDenied
    elif action == "discard":
        if not request.user.has_perm("django_gator.cancel_job"):
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
    jobs = _matching(filters)
    if request.POST.get("confirm") != "yes":
        count = jobs.count()
        context = {
            **_context(
                model_admin,
                request,
                "Are you sure?",
                (reverse("admin:django_gator_job_dead"), _("Dead jobs")),
            ),
            "action": action,
            "count": count,
            "filters": filters,
            "target_queue": target_queue or "",
            "groups": list(
                jobs.values("name", "error_class").annotate(count=Count("id")).order_by("name")
            )[:50],
        }
        return TemplateResponse(request, "admin/django_gator/job/confirm_bulk.html", context)
    if action == "retry":
        changed = jobs.retry(by=_username(request), queue=target_queue)
        where = f" onto queue {target_queue!r}" if target_queue else ""
        messages.success(request, f"{changed} job(s) queued to run again{where}.")
    else:
        changed = jobs.discard(by=_username(request))
        messages.success(request, f"{changed} job(s) discarded (now cancelled).")
    return HttpResponseRedirect(here)


class ArgumentsError(ValueError):
    """Edited arguments that cannot be stored or would not fit the job's handler."""


#: The audit action of an argument edit. Its entry keeps ``before`` and ``after``, each
#: ``{"args": [...], "kwargs": {...}}`` (the real values; pages show them redacted), so an
#: edit can be read and undone.
EDIT_ACTION = "edit_arguments"


def restorable_edit(job: Job, index: Any) -> dict[str, Any] | None:
    """The audit entry number ``index`` of ``job`` if it is an argument edit that kept the
    values it replaced, else None."""
    try:
        position = int(index)
    except (TypeError, ValueError):
        return None
    entries = job.audit or []
    if not 0 <= position < len(entries):
        return None
    entry = entries[position]
    if not isinstance(entry, dict) or entry.get("action") != EDIT_ACTION:
        return None
    return entry if isinstance(entry.get("before"), dict) else None


def last_restorable_edit(job: Job) -> int | None:
    """The index in ``job.audit`` of its latest argument edit that can be undone."""
    for index in range(len(job.audit or []) - 1, -1, -1):
        if restorable_edit(job, index) is not None:
            return index
    return None


def _values(payload: dict[str, Any]) -> tuple[Any, Any]:
    return payload.get("args", []), payload.get("kwargs", {})


def parse_arguments(
    job: Job, args_text: str, kwargs_text: str, *, hidden: tuple[Any, Any] | None = None
) -> tuple[list[Any], dict[str, Any]]:
    """The edited (args, kwargs) of ``job``; values left as the redaction mask keep the
    hidden value they stand for: the job's current one, or the one in ``hidden`` (the
    (args, kwargs) the form showed, when it restores an earlier edit's values).
    ArgumentsError names what is wrong."""
    try:
        args = json.loads(args_text)
    except json.JSONDecodeError as exc:
        raise ArgumentsError(f"args is not valid JSON: {exc}") from None
    try:
        kwargs = json.loads(kwargs_text)
    except json.JSONDecodeError as exc:
        raise ArgumentsError(f"kwargs is not valid JSON: {exc}") from None
    if not isinstance(args, list):
        raise ArgumentsError(f"args must be a JSON list, got {validation.short_repr(args)}")
    if not isinstance(kwargs, dict):
        raise ArgumentsError(f"kwargs must be a JSON object, got {validation.short_repr(kwargs)}")
    hidden_args, hidden_kwargs = hidden if hidden is not None else (job.args, job.kwargs)
    args = _unmask(args, hidden_args)
    kwargs = _unmask(kwargs, hidden_kwargs)
    try:
        validation.encode_payload(args, kwargs)
        get_job_class(job.name).check_arguments(args, kwargs)
    except JobNotRegistered:
        pass  # nothing to check against; the worker will say so again
    except (TypeError, ValueError) as exc:
        raise ArgumentsError(str(exc)) from None
    return args, kwargs


def _unmask(edited: Any, original: Any) -> Any:
    """Put back the hidden values that the form showed as the mask and the user kept."""
    if edited == redaction.MASK:
        return original
    if isinstance(edited, dict) and isinstance(original, dict):
        return {k: _unmask(v, original.get(k)) for k, v in edited.items()}
    if isinstance(edited, list) and isinstance(original, list):
        return [
            _unmask(v, original[i] if i < len(original) else None) for i, v in enumerate(edited)
        ]
    return edited


def _save_arguments(
    pk: int, args_text: str, kwargs_text: str, restore: str, by: str
) -> tuple[list[Any], dict[str, Any]] | None:
    """Store the edited arguments of dead or failed job ``pk`` and the audit entry that
    keeps the values they replace, in one transaction with the row locked; None if the job
    is no longer dead or failed. ``restore``: the audit index whose ``before`` values the
    form showed (masked values stand for those), or ''."""
    from django.db import transaction

    from django_gator import conf

    alias = conf.database()
    with transaction.atomic(using=alias):
        job = (
            Job.objects.using(alias)
            .select_for_update()
            .filter(pk=pk, state__in=(JobState.DEAD, JobState.FAILED))
            .first()
        )
        if job is None:
            return None
        hidden = None
        if restore:
            entry = restorable_edit(job, restore)
            if entry is None:
                raise ArgumentsError(_nothing_to_restore(restore))
            hidden = _values(entry["before"])
        args, kwargs = parse_arguments(job, args_text, kwargs_text, hidden=hidden)
        Job.objects.using(alias).filter(pk=pk).update(args=args, kwargs=kwargs)
        record(
            alias,
            [pk],
            EDIT_ACTION,
            by,
            before={"args": job.args, "kwargs": job.kwargs},
            after={"args": args, "kwargs": kwargs},
        )
    return args, kwargs


def _nothing_to_restore(index: str) -> str:
    return (
        f"There is nothing to restore at audit entry {index!r}: it is not an edit of the "
        "arguments that kept the values it replaced."
    )


def edit_arguments(model_admin: ModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    """Edit a dead or failed job's arguments, then retry it if asked. The audit trail keeps
    who, when, and the values before and after; ``?restore=N`` fills the form with the
    values from before the edit in audit entry N (to undo it)."""
    if not request.user.has_perm("django_gator.retry_job"):
        raise PermissionDenied
    job = get_object_or_404(Job, pk=object_id)
    detail = reverse("admin:django_gator_job_change", args=[job.pk])
    if job.state not in (JobState.DEAD, JobState.FAILED):
        messages.error(
            request, f"Job {job.pk} is {job.state}: only dead and failed jobs can be edited."
        )
        return HttpResponseRedirect(detail)
    data = request.POST if request.method == "POST" else request.GET
    restore = str(data.get("restore", "")).strip()
    restoring = restorable_edit(job, restore) if restore else None
    error = _nothing_to_restore(restore) if restore and restoring is None else ""
    base = _values(restoring["before"]) if restoring else (job.args, job.kwargs)
    shown_args, shown_kwargs = redaction.redact_payload(job.name, *base)
    args_text = json.dumps(shown_args, indent=2, ensure_ascii=False)
    kwargs_text = json.dumps(shown_kwargs, indent=2, ensure_ascii=False)
    if request.method == "POST" and not error:
        args_text = request.POST.get("args", "")
        kwargs_text = request.POST.get("kwargs", "")
        try:
            saved = _save_arguments(job.pk, args_text, kwargs_text, restore, _username(request))
        except ArgumentsError as exc:
            error = str(exc)
        else:
            if saved is None:
                messages.error(request, f"Job {job.pk} changed meanwhile; nothing was saved.")
                return HttpResponseRedirect(detail)
            if request.POST.get("retry") == "on":
                Job.objects.filter(pk=job.pk).retry(by=_username(request))
                messages.success(request, f"Arguments of job {job.pk} saved; it will run again.")
            else:
                messages.success(request, f"Arguments of job {job.pk} saved.")
            return HttpResponseRedirect(detail)
    context = {
        **_context(
            model_admin,
            request,
            f"Edit the arguments of job {job.pk}",
            (detail, str(job)),
            crumb=_("Edit arguments"),
        ),
        "job": job,
        "args_text": args_text,
        "kwargs_text": kwargs_text,
        "error": error,
        "mask": redaction.MASK,
        "restoring": restoring,
        "restore": restore if restoring else "",
    }
    return TemplateResponse(request, "admin/django_gator/job/edit_arguments.html", context)


def describe_queues(queues: Any) -> str:
    """A worker's queues as an operator reads them: ``critical (weight 8), default
    (weight 1)``, or ``all queues`` for a worker started without ``-q``. The worker stores
    ``[[name, weight], ...]``; anything else is shown as it is."""
    if not queues:
        return _("all queues")
    if not isinstance(queues, list):
        return json.dumps(queues, ensure_ascii=False)
    parts = []
    for entry in queues:
        if isinstance(entry, list) and len(entry) == 2:
            parts.append(
                _("%(queue)s (weight %(weight)s)") % {"queue": entry[0], "weight": entry[1]}
            )
        else:
            parts.append(
                json.dumps(entry, ensure_ascii=False) if not isinstance(entry, str) else entry
            )
    return ", ".join(parts)


def error_class_choices() -> list[str]:
    """Error classes of dead and failed jobs (for the changelist filter)."""
    values = (
        Job.objects.filter(Q(state=JobState.DEAD) | Q(state=JobState.FAILED))
        .exclude(error_class__isnull=True)
        .order_by()
        .values_list("error_class", flat=True)
        .distinct()[:200]
    )
    return sorted(value for value in values if value)


def throughput(minutes: int = 60) -> list[dict[str, Any]]:
    """Succeeded and dead jobs per minute over the last ``minutes``, oldest first (read
    through the (state, finished_at) index)."""
    from datetime import timedelta

    from django.db.models.functions import TruncMinute

    from django_gator import conf
    from django_gator.engines import get_engine

    now = get_engine(conf.database()).db_now().replace(second=0, microsecond=0)
    since = now - timedelta(minutes=minutes - 1)
    rows = (
        Job.objects.filter(state__in=(JobState.SUCCEEDED, JobState.DEAD), finished_at__gte=since)
        .annotate(minute=TruncMinute("finished_at"))
        .values("minute", "state")
        .annotate(n=Count("id"))
        .order_by()
    )
    buckets = {since + timedelta(minutes=i): {"succeeded": 0, "dead": 0} for i in range(minutes)}
    for row in rows:
        minute = row["minute"]
        if minute is None:
            continue
        key = minute.replace(second=0, microsecond=0)
        if key in buckets:
            buckets[key][row["state"]] += row["n"]
    return [{"minute": minute, **counts} for minute, counts in sorted(buckets.items())]


#: The chart's colours: succeeded and dead jobs.
CHART_COLOURS = {"succeeded": "#3a8c3a", "dead": "#c0392b"}


def chart_svg(points: list[dict[str, Any]], width: int = 720, height: int = 210) -> str:
    """A server-rendered SVG of ``throughput()``: stacked bars of succeeded (green) and dead
    (red) jobs per minute, with a legend, a count axis (0, half, top) and a time axis
    labelled every 10 minutes in the admin's time zone. No script, no external file: the
    admin works offline. Text uses ``currentColor``, so it follows the admin's theme."""
    from django.utils import timezone
    from django.utils.html import escape

    top = max([p["succeeded"] + p["dead"] for p in points] + [1])
    left, right, head, foot = 48, 8, 26, 36
    plot_w, plot_h = width - left - right, height - head - foot
    base = head + plot_h
    bar_w = plot_w / max(len(points), 1)

    def y(value: float) -> float:
        return base - plot_h * value / top

    legend_x = width - right - 150
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" class="gator-chart" '
        f'aria-label="Jobs finished per minute over the last {len(points)} minutes">',
        '<g fill="currentColor" font-size="11">',
        f'<g class="gator-legend" transform="translate({legend_x} 6)">'
        f'<rect x="0" y="0" width="10" height="10" fill="{CHART_COLOURS["succeeded"]}"/>'
        '<text x="14" y="9">succeeded</text>'
        f'<rect x="90" y="0" width="10" height="10" fill="{CHART_COLOURS["dead"]}"/>'
        '<text x="104" y="9">dead</text></g>',
        '<g class="gator-y-axis" text-anchor="end">',
    ]
    for value in sorted({0, round(top / 2), top}):
        parts.append(
            f'<line x1="{left}" y1="{y(value):.1f}" x2="{width - right}" y2="{y(value):.1f}" '
            'stroke="#999" stroke-opacity="0.35"/>'
            f'<text x="{left - 4}" y="{y(value) + 4:.1f}">{value}</text>'
        )
    parts.append('<text x="4" y="15" text-anchor="start">jobs/min</text></g>')
    parts.append(
        f'<line x1="{left}" y1="{head}" x2="{left}" y2="{base}" stroke="#999"/>'
        f'<line x1="{left}" y1="{base}" x2="{width - right}" y2="{base}" stroke="#999"/>'
    )
    for i, point in enumerate(points):
        x = left + i * bar_w + 0.5
        ok_h = plot_h * point["succeeded"] / top
        dead_h = plot_h * point["dead"] / top
        minute = timezone.localtime(point["minute"])
        label = escape(f"{minute:%H:%M}: {point['succeeded']} succeeded, {point['dead']} dead")
        parts.append(f"<g><title>{label}</title>")
        if ok_h:
            parts.append(
                f'<rect x="{x:.1f}" y="{base - ok_h:.1f}" width="{max(bar_w - 1, 1):.1f}" '
                f'height="{ok_h:.1f}" fill="{CHART_COLOURS["succeeded"]}"/>'
            )
        if dead_h:
            parts.append(
                f'<rect x="{x:.1f}" y="{base - ok_h - dead_h:.1f}" '
                f'width="{max(bar_w - 1, 1):.1f}" height="{dead_h:.1f}" '
                f'fill="{CHART_COLOURS["dead"]}"/>'
            )
        parts.append("</g>")
    parts.append('<g class="gator-x-axis" text-anchor="middle">')
    zone = ""
    for i, point in enumerate(points):
        minute = timezone.localtime(point["minute"])
        zone = minute.tzname() or ""
        if minute.minute % 10 == 0:
            x = left + (i + 0.5) * bar_w
            parts.append(
                f'<line x1="{x:.1f}" y1="{base}" x2="{x:.1f}" y2="{base + 4}" stroke="#999"/>'
                f'<text x="{x:.1f}" y="{base + 15}">{minute:%H:%M}</text>'
            )
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 4}">'
        f"{escape(f'time ({zone})' if zone else 'time')}</text></g>"
    )
    parts.append("</g></svg>")
    return "".join(parts)


def dashboard(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """Per-queue counts, the age of the oldest due job, the last hour's throughput and the
    live workers."""
    from django.utils.safestring import mark_safe

    from django_gator import stats

    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    points = throughput()
    total, exact = stats.estimated_total()
    queues = stats.queue_stats()
    workers = stats.workers()
    context = {
        **_context(model_admin, request, "Job dashboard"),
        "queues": queues,
        "workers": workers,
        "unserved": stats.unserved_queues(queues, workers),
        "chart": mark_safe(chart_svg(points)),  # noqa: S308 - built from numbers, escaped text
        "succeeded_hour": sum(p["succeeded"] for p in points),
        "dead_hour": sum(p["dead"] for p in points),
        "total": total,
        "total_estimated": not exact,
        "refresh": request.GET.get("refresh", ""),
    }
    return TemplateResponse(request, "admin/django_gator/job/dashboard.html", context)
