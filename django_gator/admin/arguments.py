"""Editing a dead or failed job's arguments (then retrying it, if asked), and undoing an edit.

Needs the ``retry_job`` permission. The form shows the values named by ``GATOR_REDACT`` as
the mask, and a value left as the mask keeps the hidden value it stands for. Each save is a
POST (CSRF-checked by the admin) that stores the arguments and an audit entry with the
user's name and the values before and after, in one transaction with the row locked.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.translation import gettext as _

from django_gator import conf, redaction, validation
from django_gator.admin.pages import RETRY_PERMISSION, AdminPage, username
from django_gator.encryption import holds_sealed, is_sealed
from django_gator.exceptions import JobNotRegistered
from django_gator.models import Job, JobState, record
from django_gator.payload import encode_payload
from django_gator.queueable import get_job_class

#: The audit action of an argument edit. Its entry keeps ``before`` and ``after``, each
#: ``{"args": [...], "kwargs": {...}}`` (the real values; pages show them redacted), so an
#: edit can be read and undone.
EDIT_ACTION = "edit_arguments"
#: The states whose jobs' arguments can be edited.
EDITABLE_STATES = (JobState.DEAD, JobState.FAILED)


class ArgumentsError(ValueError):
    """Edited arguments that cannot be stored or would not fit the job's handler."""


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
        encode_payload(args, kwargs)
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


def save_arguments(
    pk: int, args_text: str, kwargs_text: str, restore: str, by: str
) -> tuple[list[Any], dict[str, Any]] | None:
    """Store the edited arguments of dead or failed job ``pk`` and the audit entry that
    keeps the values they replace, in one transaction with the row locked; None if the job
    is no longer dead or failed. ``restore``: the audit index whose ``before`` values the
    form showed (masked values stand for those), or ''."""
    alias = conf.database()
    with transaction.atomic(using=alias):
        job = (
            Job.objects.using(alias)
            .select_for_update()
            .filter(pk=pk, state__in=EDITABLE_STATES)
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


class EditArgumentsView(AdminPage):
    """``admin:django_gator_job_edit_arguments``: the form (GET) and its save (POST), then a
    retry if asked. ``?restore=N`` fills the form with the values from before the edit in
    audit entry N (to undo it)."""

    template_name = "admin/django_gator/job/edit_arguments.html"

    def has_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(RETRY_PERMISSION))

    def get(self, request: HttpRequest, object_id: str) -> HttpResponse:
        job = self.editable_job(request, object_id)
        if isinstance(job, HttpResponse):
            return job
        restore, restoring, error = self.restoring(job, request.GET)
        return self.form(job, *self.shown(job, restoring), error, restore, restoring)

    def post(self, request: HttpRequest, object_id: str) -> HttpResponse:
        job = self.editable_job(request, object_id)
        if isinstance(job, HttpResponse):
            return job
        restore, restoring, error = self.restoring(job, request.POST)
        if error:
            return self.form(job, *self.shown(job, restoring), error, restore, restoring)
        args_text = request.POST.get("args", "")
        kwargs_text = request.POST.get("kwargs", "")
        try:
            saved = save_arguments(job.pk, args_text, kwargs_text, restore, username(request))
        except ArgumentsError as exc:
            return self.form(job, args_text, kwargs_text, str(exc), restore, restoring)
        detail = reverse("admin:django_gator_job_change", args=[job.pk])
        if saved is None:
            messages.error(request, f"Job {job.pk} changed meanwhile; nothing was saved.")
        elif request.POST.get("retry") == "on":
            Job.objects.filter(pk=job.pk).retry(by=username(request))
            messages.success(request, f"Arguments of job {job.pk} saved; it will run again.")
        else:
            messages.success(request, f"Arguments of job {job.pk} saved.")
        return HttpResponseRedirect(detail)

    @staticmethod
    def editable_job(request: HttpRequest, object_id: str) -> Job | HttpResponse:
        """The job, or a redirect to its page saying why it cannot be edited."""
        job = get_object_or_404(Job, pk=object_id)
        if is_sealed(job.args) or holds_sealed(job.kwargs):
            messages.error(request, f"Job {job.pk}'s arguments are encrypted: not editable here.")
        elif job.state in EDITABLE_STATES:
            return job
        else:
            messages.error(
                request, f"Job {job.pk} is {job.state}: only dead and failed jobs can be edited."
            )
        return HttpResponseRedirect(reverse("admin:django_gator_job_change", args=[job.pk]))

    @staticmethod
    def restoring(job: Job, data: Any) -> tuple[str, dict[str, Any] | None, str]:
        """The ``restore`` index asked for, the audit entry it names (None if none or not a
        restorable edit) and the error to show when it names none."""
        restore = str(data.get("restore", "")).strip()
        restoring = restorable_edit(job, restore) if restore else None
        error = _nothing_to_restore(restore) if restore and restoring is None else ""
        return restore, restoring, error

    @staticmethod
    def shown(job: Job, restoring: dict[str, Any] | None) -> tuple[str, str]:
        """The (args, kwargs) text the form starts with, redacted: the job's, or those from
        before the edit being restored."""
        base = _values(restoring["before"]) if restoring else (job.args, job.kwargs)
        shown_args, shown_kwargs = redaction.redact_payload(job.name, *base)
        return (
            json.dumps(shown_args, indent=2, ensure_ascii=False),
            json.dumps(shown_kwargs, indent=2, ensure_ascii=False),
        )

    def form(
        self,
        job: Job,
        args_text: str,
        kwargs_text: str,
        error: str,
        restore: str,
        restoring: dict[str, Any] | None,
    ) -> HttpResponse:
        detail = reverse("admin:django_gator_job_change", args=[job.pk])
        context = {
            **self.context(
                f"Edit the arguments of job {job.pk}", (detail, str(job)), crumb=_("Edit arguments")
            ),
            "job": job,
            "args_text": args_text,
            "kwargs_text": kwargs_text,
            "error": error,
            "mask": redaction.MASK,
            "restoring": restoring,
            "restore": restore if restoring else "",
        }
        return self.render(context)
