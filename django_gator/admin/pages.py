"""What the job admin's own pages share: the admin's context and breadcrumbs, and the
class-based view they are built on.

Each page is served by ``JobAdmin.get_urls()`` through the admin site's ``admin_view``
(staff login, CSRF checking of every POST, no caching), as Django serves its own
autocomplete view, and checks the permission it needs before doing anything else.
"""

from __future__ import annotations

from typing import Any

import django
from django.contrib.admin import ModelAdmin
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import HttpRequest, HttpResponseBase
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.text import capfirst
from django.utils.translation import gettext as _
from django.views import View

from django_gator.admin import reading

#: The permission to retry a job or edit its arguments, and the one to cancel or discard it.
RETRY_PERMISSION = "django_gator.retry_job"
CANCEL_PERMISSION = "django_gator.cancel_job"
#: The permission to pause and resume queues (the dashboard's buttons).
PAUSE_PERMISSION = "django_gator.pause_queue"

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


def username(request: HttpRequest) -> str:
    """The requesting user's name, as the audit trail records it."""
    return str(request.user.get_username())


class AdminPage(View):
    """A page of the job admin: ``as_view(model_admin=...)`` gives it the ModelAdmin whose
    site, model and permissions it uses."""

    model_admin: ModelAdmin | None = None
    template_name = ""

    @property
    def admin(self) -> ModelAdmin:
        if self.model_admin is None:
            raise ImproperlyConfigured(
                f"{type(self).__name__} needs a ModelAdmin: route it with "
                f"{type(self).__name__}.as_view(model_admin=...), as JobAdmin.get_urls() does."
            )
        return self.model_admin

    def has_permission(self, request: HttpRequest) -> bool:
        """Whether the user may use this page at all: the job view permission, unless the
        page says otherwise. Each change it makes checks its own permission besides."""
        return self.admin.has_view_permission(request)

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not self.has_permission(request):
            raise PermissionDenied
        response = super().dispatch(request, *args, **kwargs)
        reading.wrote(request)  # a POST: the next pages read the primary until the replica has it
        return response

    def context(
        self, title: str, *between: tuple[str, str], crumb: str | None = None
    ) -> dict[str, Any]:
        """The admin's context for this page; its breadcrumbs end with ``between`` and
        ``crumb`` (default: the title)."""
        return {
            **self.admin.admin_site.each_context(self.request),
            **breadcrumbs(self.admin, crumb or title, *between),
            "opts": self.admin.model._meta,
            "title": title,
            "has_view_permission": True,
            **reading.context(self.request),
        }

    def render(self, context: dict[str, Any], template_name: str | None = None) -> TemplateResponse:
        return TemplateResponse(self.request, template_name or self.template_name, context)
