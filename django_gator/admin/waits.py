"""A workflow's wait steps on its admin page: each with its signal, its deadline and, while
it waits, Approve and Reject buttons; and the workflow's Retry (its failed steps, with
``django_gator.retry_job``) and Cancel (``django_gator.cancel_job``) buttons. They POST
(CSRF-checked by the admin site) to :class:`WaitDecisionView`; a decision needs the
``django_gator.signal_workflow`` permission, and who decided, when, and their note are
kept on the workflow's row (``WorkflowRun.signals``).

Approve delivers the signal with ``{"approved": true, "by": user, "note": note}`` as the
wait's result; Reject ends the wait dead, cancelling the steps after it (see
``WorkflowRun.reject``). The buttons sit inside the page's own form (a read-only change
form) and post to this view with ``formaction``: forms cannot nest.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from django_gator.admin.pages import CANCEL_PERMISSION, RETRY_PERMISSION, AdminPage, username
from django_gator.exceptions import WorkflowError
from django_gator.models import Job, WorkflowRun, WorkflowStep
from django_gator.states import StepState

SIGNAL_PERMISSION = "django_gator.signal_workflow"
DECISIONS = ("approve", "reject", "retry", "cancel")


def waits_table(run: WorkflowRun, request: HttpRequest, site: str) -> SafeString:
    """The wait steps of ``run``: signal, state, deadline, who decided; buttons where the
    user may decide one still open."""
    waits = list(
        WorkflowStep.objects.filter(workflow=run).exclude(wait_for="").order_by("position")
    )
    if not waits:
        return SafeString("-")
    ids = [w.job_id for w in waits if w.job_id is not None]
    due = dict(Job.objects.filter(pk__in=ids).values_list("pk", "next_execution_at"))
    may = request.user.has_perm(SIGNAL_PERMISSION)
    url = reverse(f"{site}:django_gator_workflowrun_decide", args=[run.pk])
    rows = format_html_join(
        "\n",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        (
            (
                wait.label or wait.position,
                wait.wait_for,
                wait.state,
                _deadline(wait, due),
                _decision(wait, run, url, may),
            )
            for wait in waits
        ),
    )
    return format_html(
        '<table class="gator-workflow-waits"><thead><tr><th>step</th><th>signal</th>'
        "<th>state</th><th>deadline</th><th>signal received</th></tr></thead>"
        "<tbody>{}</tbody></table>",
        rows,
    )


def _deadline(wait: WorkflowStep, due: dict[int, Any]) -> str:
    if wait.job_id is None:
        return "not reached yet"
    when = due.get(wait.job_id)
    if when is None or wait.delay is None or wait.delay > 50 * 365 * 24 * 3600:
        return "none"
    return when.isoformat(timespec="seconds")


def _decision(wait: WorkflowStep, run: WorkflowRun, url: str, may: bool) -> Any:
    entry = (run.signals or {}).get(wait.wait_for)
    if entry is not None:
        verb = "rejected" if entry.get("rejected") else "received"
        return format_html("{} at {} by {}", verb, entry.get("at", "?"), entry.get("by") or "-")
    if wait.state in (StepState.SUCCEEDED, StepState.DEAD, StepState.CANCELLED) or not may:
        return "-"
    return format_html(
        '<input type="text" name="note" placeholder="note" maxlength="500"> '
        '<button type="submit" formaction="{url}" name="decision" value="approve:{name}" '
        'class="button">Approve</button> '
        '<button type="submit" formaction="{url}" name="decision" value="reject:{name}" '
        'class="button">Reject</button>',
        url=url,
        name=wait.wait_for,
    )


class WaitDecisionView(AdminPage):
    """``admin:django_gator_workflowrun_decide``: POST ``decision`` (``approve:NAME`` or
    ``reject:NAME``) and ``note``; back to the workflow's page with a message."""

    def get(self, request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
        return HttpResponseNotAllowed(["POST"])

    def post(self, request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
        site = self.admin.admin_site.name
        back = HttpResponseRedirect(
            reverse(f"{site}:django_gator_workflowrun_change", args=[run_id])
        )
        decision, _, name = request.POST.get("decision", "").partition(":")
        note = request.POST.get("note", "").strip()[:500]
        run = WorkflowRun.objects.filter(pk=run_id).first()
        if decision not in DECISIONS or run is None:
            messages.error(request, "Nothing changed: an unknown workflow or decision.")
            return back
        by = username(request)
        if decision in ("retry", "cancel"):
            return self._operate(request, run, decision, by, back)
        if not request.user.has_perm(SIGNAL_PERMISSION):
            raise PermissionDenied
        try:
            if decision == "approve":
                done = run.signal(name, {"approved": True, "by": by, "note": note}, by=by)
            else:
                done = run.reject(name, by=by, note=note)
        except WorkflowError as exc:
            messages.error(request, f"Nothing changed: {exc}")
            return back
        if not done:
            messages.warning(request, f"The signal {name!r} had come already; nothing changed.")
        elif decision == "approve":
            messages.success(request, f"Approved {name!r}: the steps after it are released.")
        else:
            messages.success(request, f"Rejected {name!r}: the steps after it are cancelled.")
        return back

    def _operate(
        self, request: HttpRequest, run: WorkflowRun, decision: str, by: str, back: HttpResponse
    ) -> HttpResponse:
        """Retry the workflow's failed steps (``retry_job``) or cancel it (``cancel_job``)."""
        if not request.user.has_perm(
            RETRY_PERMISSION if decision == "retry" else CANCEL_PERMISSION
        ):
            raise PermissionDenied
        if decision == "retry":
            count = run.retry(by=by)
            messages.success(request, f"{count} failed step job(s) of this workflow due again.")
        else:
            count = run.cancel(by=by)
            messages.success(request, f"Workflow cancelled: {count} job(s) and step(s) changed.")
        return back

    def has_permission(self, request: HttpRequest) -> bool:
        return self.admin.has_view_permission(request)


def operations(run: WorkflowRun, request: HttpRequest, site: str) -> SafeString:
    """The workflow's Retry and Cancel buttons, those the user may use."""
    url = reverse(f"{site}:django_gator_workflowrun_decide", args=[run.pk])
    buttons = []
    if request.user.has_perm(RETRY_PERMISSION):
        buttons.append(("retry:", "Retry the failed steps"))
    if request.user.has_perm(CANCEL_PERMISSION):
        buttons.append(("cancel:", "Cancel the workflow"))
    return format_html_join(
        " ",
        '<button type="submit" formaction="{}" name="decision" value="{}" class="button">'
        "{}</button>",
        ((url, value, label) for value, label in buttons),
    )
