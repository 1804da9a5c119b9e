"""What the admin's own pages share: breadcrumbs, permissions, routing."""

from __future__ import annotations

import re

import django
import pytest
from django.contrib import admin
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, RequestFactory
from django.urls import reverse

from django_gator.admin import JobAdmin, ScheduleAdmin, WorkerAdmin
from django_gator.admin.dashboard import DashboardView
from django_gator.models import Job, Schedule, Worker
from tests.admin_helpers import dead_jobs

pytestmark = pytest.mark.django_db(transaction=True)

DEAD = "admin:django_gator_job_dead"


def _breadcrumbs(html: str) -> str:
    """The breadcrumbs of an admin page, whitespace squeezed."""
    match = re.search(r'<nav aria-label="Breadcrumbs">(.*?)</nav>', html, re.S)
    assert match, html[:2000]
    return re.sub(r"\s+", " ", match.group(1)).strip()


def test_the_custom_pages_render_breadcrumbs_as_djangos_own_pages_do(admin_client: Client):
    groups = dead_jobs()
    job = groups["logins"][0]
    own = _breadcrumbs(
        admin_client.get(reverse("admin:django_gator_job_change", args=[job.pk])).content.decode()
    )
    if django.VERSION >= (6, 1):
        assert own.startswith('<ol class="breadcrumbs"> <li><a href="/admin/">Home</a></li>')
        assert own.endswith(f'<li aria-current="page">{job}</li> </ol>')
    else:
        assert own.startswith('<div class="breadcrumbs"> <a href="/admin/">Home</a> &rsaquo; ')
    dead = reverse(DEAD)
    pages = {
        "Dead jobs": admin_client.get(dead),
        "Dead jobs &rsaquo; Are you sure?": admin_client.post(
            dead, {"action": "retry", "state": "dead"}
        ),
        "Job dashboard": admin_client.get(reverse("admin:django_gator_job_dashboard")),
        f"{job} &rsaquo; Edit arguments": admin_client.get(
            reverse("admin:django_gator_job_edit_arguments", args=[job.pk])
        ),
        "Are you sure?": admin_client.post(
            reverse("admin:django_gator_job_changelist"),
            {"action": "retry_jobs", "_selected_action": [job.pk]},
        ),
    }
    for trail, response in pages.items():
        ours = _breadcrumbs(response.content.decode())
        texts = re.sub(r"<[^>]+>", "", ours.replace("</li> <li", "</li> &rsaquo; <li"))
        expected = f"Home &rsaquo; Background jobs &rsaquo; Jobs &rsaquo; {trail}"
        assert re.sub(r"\s+", " ", texts).strip() == expected, (trail, ours)
        if django.VERSION >= (6, 1):
            assert ours.startswith('<ol class="breadcrumbs"> <li><a href="/admin/">Home</a></li>')
            assert ours.count("<li") == expected.count("&rsaquo;") + 1, ours
            assert ours.endswith(
                f'<li aria-current="page">{trail.split(" &rsaquo; ")[-1]}</li> </ol>'
            )
            assert "&rsaquo;" not in ours  # the CSS draws the separators
        else:
            assert ours.startswith('<div class="breadcrumbs"> <a href="/admin/">Home</a> &rsaquo; ')
            assert "<li" not in ours


def test_the_package_registers_the_job_worker_and_schedule_admins():
    # Django's autodiscovery imports django_gator.admin, the package.
    assert type(admin.site._registry[Job]) is JobAdmin
    assert type(admin.site._registry[Worker]) is WorkerAdmin
    assert type(admin.site._registry[Schedule]) is ScheduleAdmin


def test_the_pages_refuse_a_method_they_do_not_serve(admin_client: Client):
    dashboard = reverse("admin:django_gator_job_dashboard")
    assert admin_client.get(dashboard).status_code == 200
    assert admin_client.post(dashboard).status_code == 405
    assert admin_client.put(reverse(DEAD)).status_code == 405
    job = dead_jobs()["booms"][0]
    edit = reverse("admin:django_gator_job_edit_arguments", args=[job.pk])
    assert admin_client.delete(edit).status_code == 405
    # The Retry button's view takes a POST only, as before.
    retry = reverse("admin:django_gator_job_retry", args=[job.pk])
    assert admin_client.get(retry).status_code == 405
    job.refresh_from_db()
    assert job.state == "dead"


def test_a_page_routed_without_its_model_admin_says_how_to_route_it(admin_user):
    request = RequestFactory().get("/")
    request.user = admin_user
    with pytest.raises(
        ImproperlyConfigured,
        match=r"DashboardView needs a ModelAdmin.*"
        r"DashboardView\.as_view\(model_admin=\.\.\.\)",
    ):
        DashboardView.as_view()(request)
