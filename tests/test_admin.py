"""The Job admin: read-only pages, permissioned POST actions, escaped content."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_gator.models import Job, JobState

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_gator_job_changelist"


def dead_job(**fields) -> Job:
    defaults = {
        "name": "tests.testapp.jobs.Boom",
        "args": ["<script>alert(1)</script>"],
        "state": JobState.DEAD,
        "attempts": 1,
        "last_error": "RuntimeError: <b>bold</b>",
        "errors": [
            {
                "attempt": 1,
                "at": "2026-01-01T00:00:00+00:00",
                "worker": "w1",
                "class": "RuntimeError",
                "message": "<b>bold</b>",
                "traceback": "Traceback ...\n<img src=x onerror=alert(1)>",
            }
        ],
    }
    defaults.update(fields)
    return Job.objects.create(**defaults)


def staff(*perms: str) -> User:
    user = User.objects.create_user("op", password="pw", is_staff=True)
    for codename in ("view_job", *perms):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def test_changelist_and_detail_render_with_html_escaped(admin_client: Client):
    job = dead_job()

    listing = admin_client.get(reverse(CHANGELIST))
    detail = admin_client.get(reverse("admin:django_gator_job_change", args=[job.pk]))

    assert listing.status_code == 200
    assert detail.status_code == 200
    body = detail.content.decode()
    assert "&lt;img src=x onerror=alert(1)&gt;" in body
    assert "<img src=x" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "<script>alert(1)</script>" not in body
    assert "<b>bold</b>" not in listing.content.decode()


def test_retry_action_needs_the_retry_permission():
    job = dead_job()
    client = Client()
    client.force_login(staff())

    response = client.post(
        reverse(CHANGELIST), {"action": "retry_jobs", "_selected_action": [job.pk]}
    )

    job.refresh_from_db()
    assert job.state == JobState.DEAD
    assert response.status_code in (200, 302, 403)
    assert b"retry_jobs" not in client.get(reverse(CHANGELIST)).content


def test_retry_action_requeues_dead_jobs_and_keeps_their_history():
    job = dead_job()
    client = Client()
    client.force_login(staff("retry_job"))

    response = client.post(
        reverse(CHANGELIST), {"action": "retry_jobs", "_selected_action": [job.pk]}
    )

    assert response.status_code == 302
    job.refresh_from_db()
    assert job.state == JobState.WAITING
    assert job.attempts == 1
    assert len(job.errors) == 1


def test_actions_refuse_a_post_without_csrf_token():
    job = dead_job()
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff("retry_job"))

    response = client.post(
        reverse(CHANGELIST), {"action": "retry_jobs", "_selected_action": [job.pk]}
    )

    assert response.status_code == 403
    job.refresh_from_db()
    assert job.state == JobState.DEAD


def test_cancel_action_leaves_running_and_finished_jobs_alone():
    waiting = Job.objects.create(name="x.Waiting")
    running = Job.objects.create(
        name="x.Running", state=JobState.RUNNING, reserved_by="w", locked_at="2026-01-01T00:00Z"
    )
    done = Job.objects.create(name="x.Done", state=JobState.SUCCEEDED)
    client = Client()
    client.force_login(staff("cancel_job"))

    client.post(
        reverse(CHANGELIST),
        {"action": "cancel_jobs", "_selected_action": [waiting.pk, running.pk, done.pk]},
    )

    states = dict(Job.objects.values_list("name", "state"))
    assert states == {
        "x.Waiting": JobState.CANCELLED,
        "x.Running": JobState.RUNNING,
        "x.Done": JobState.SUCCEEDED,
    }


def test_get_never_mutates(admin_client: Client):
    job = dead_job()

    admin_client.get(reverse(CHANGELIST), {"action": "retry_jobs", "_selected_action": [job.pk]})

    job.refresh_from_db()
    assert job.state == JobState.DEAD
