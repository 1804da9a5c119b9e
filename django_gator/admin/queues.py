"""The dashboard's Pause and Resume buttons: a POST (CSRF-checked by the admin site) that
needs the ``django_gator.pause_queue`` permission, recorded with the user's name and the
time on the queue's row."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import reverse

from django_gator import pausing
from django_gator.admin.pages import PAUSE_PERMISSION, AdminPage, username

ACTIONS = ("pause", "resume")


class QueuePauseView(AdminPage):
    """``admin:django_gator_job_pause_queue``: POST ``queue`` and ``action`` (pause or
    resume); back to the dashboard with a message saying what happened."""

    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponseNotAllowed(["POST"])

    def post(self, request: HttpRequest) -> HttpResponse:
        if not request.user.has_perm(PAUSE_PERMISSION):
            raise PermissionDenied
        name = request.POST.get("queue", "").strip()
        action = request.POST.get("action", "")
        back = HttpResponseRedirect(reverse("admin:django_gator_job_dashboard"))
        if action not in ACTIONS:
            messages.error(request, f"Unknown queue action {action!r}: use pause or resume.")
            return back
        try:
            if action == "pause":
                changed = pausing.pause_queue(name, by=username(request))
            else:
                changed = pausing.resume_queue(name, by=username(request))
        except ValueError as exc:
            messages.error(request, f"Nothing changed: {exc}")
            return back
        if action == "pause":
            if changed:
                messages.success(
                    request,
                    f"Queue {name} paused: no worker claims its jobs until it is resumed; "
                    "running jobs finish.",
                )
            else:
                messages.warning(request, f"Queue {name} was already paused; left as it was.")
        elif changed:
            messages.success(request, f"Queue {name} resumed: workers claim its jobs again.")
        else:
            messages.warning(request, f"Queue {name} was not paused; nothing changed.")
        return back
