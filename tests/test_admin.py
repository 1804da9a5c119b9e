"""The Job admin: read-only pages, permissioned POST actions, escaped content."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_gator.models import Job, JobState, Schedule
from tests.testapp.jobs import Noop

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
    assert response.status_code == 200  # the confirmation page
    assert "Retry 1 selected job(s)?" in response.content.decode()
    job.refresh_from_db()
    assert job.state == JobState.DEAD

    response = client.post(
        reverse(CHANGELIST),
        {"action": "retry_jobs", "_selected_action": [job.pk], "post": "yes"},
    )

    assert response.status_code == 302
    job.refresh_from_db()
    assert job.state == JobState.WAITING
    assert job.audit[0]["action"] == "retry"
    assert job.audit[0]["by"] == "op"
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


def test_cancel_action_cancels_waiting_asks_running_and_leaves_finished_jobs_alone():
    waiting = Job.objects.create(name="x.Waiting")
    running = Job.objects.create(
        name="x.Running", state=JobState.RUNNING, reserved_by="w", locked_at="2026-01-01T00:00Z"
    )
    done = Job.objects.create(name="x.Done", state=JobState.SUCCEEDED)
    client = Client()
    client.force_login(staff("cancel_job"))

    client.post(
        reverse(CHANGELIST),
        {
            "action": "cancel_jobs",
            "_selected_action": [waiting.pk, running.pk, done.pk],
            "post": "yes",
        },
    )

    states = dict(Job.objects.values_list("name", "state"))
    assert states == {
        "x.Waiting": JobState.CANCELLED,
        "x.Running": JobState.RUNNING,
        "x.Done": JobState.SUCCEEDED,
    }
    requested = dict(Job.objects.values_list("name", "cancel_requested"))
    assert requested == {"x.Waiting": False, "x.Running": True, "x.Done": False}


def test_get_never_mutates(admin_client: Client):
    job = dead_job()

    admin_client.get(reverse(CHANGELIST), {"action": "retry_jobs", "_selected_action": [job.pk]})

    job.refresh_from_db()
    assert job.state == JobState.DEAD


def test_schedule_admin_lists_next_runs_and_runs_a_schedule_now_with_permission():
    schedule = Schedule(name="nightly", job_name=Noop.name, cron="0 3 * * *")
    schedule.save()
    viewer = staff("view_schedule")
    client = Client()
    client.force_login(viewer)
    url = reverse("admin:django_gator_schedule_changelist")

    listing = client.get(url)
    assert listing.status_code == 200
    assert "nightly" in listing.content.decode()
    assert b"run_now" not in listing.content  # no permission, no action

    client.post(url, {"action": "run_now", "_selected_action": [schedule.pk]})
    assert not Job.objects.exists()

    viewer.user_permissions.add(Permission.objects.get(codename="run_schedule"))
    client.force_login(User.objects.get(pk=viewer.pk))
    response = client.post(url, {"action": "run_now", "_selected_action": [schedule.pk]})
    assert response.status_code == 302
    assert Job.objects.get().name == Noop.name


def test_schedule_admin_refuses_an_invalid_cron_expression(admin_client: Client):
    response = admin_client.post(
        reverse("admin:django_gator_schedule_add"),
        {
            "name": "bad",
            "job_name": Noop.name,
            "cron": "*/5 * * *",
            "timezone": "UTC",
            "args": "[]",
            "kwargs": "{}",
            "misfire": "once",
            "catch_up_limit": "100",
        },
    )
    assert response.status_code == 200
    assert "has 4 fields; use 5" in response.content.decode()
    assert not Schedule.objects.exists()


def test_the_job_list_has_priority_seconds_and_errors_only_where_they_explain_the_state(
    admin_client: Client,
):
    at = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    dead = dead_job(priority=-3, next_execution_at=at, last_error="RuntimeError: dead-marker")
    failed = dead_job(state=JobState.FAILED, last_error="RuntimeError: failed-marker")
    cancelled = dead_job(state=JobState.CANCELLED, last_error="RuntimeError: cancel-marker")
    # Succeeded, waiting or running again after a failed attempt: that error is history.
    succeeded = dead_job(state=JobState.SUCCEEDED, last_error="RuntimeError: old-marker-1")
    waiting = dead_job(state=JobState.WAITING, last_error="RuntimeError: old-marker-2")

    page = admin_client.get(reverse(CHANGELIST)).content.decode()

    assert 'column-priority"' in page
    assert '<td class="field-priority">-3</td>' in page
    assert '<time datetime="2026-03-04T05:06:07+00:00"' in page
    assert '<span class="nowrap">2026-03-04</span> <span class="nowrap">05:06:07</span>' in page
    for marker in ("dead-marker", "failed-marker", "cancel-marker"):
        assert f"RuntimeError: {marker}" in page
    assert "old-marker" not in page
    # The detail pages: times to the second; an old error is not the job's "last error".
    detail = admin_client.get(reverse("admin:django_gator_job_change", args=[dead.pk]))
    assert '<span class="nowrap">05:06:07</span>' in detail.content.decode()
    for job, shown in (
        (
            succeeded,
            "None now (succeeded); the errors of earlier attempts are in the error history.",
        ),
        (waiting, "None now (waiting); the errors of earlier attempts are in the error history."),
        (failed, "RuntimeError: failed-marker"),
        (cancelled, "RuntimeError: cancel-marker"),
    ):
        body = admin_client.get(
            reverse("admin:django_gator_job_change", args=[job.pk])
        ).content.decode()
        field = re.search(
            r'field-last_error_shown">.*?<div class="readonly">(.*?)</div>', body, re.S
        )
        assert field, body
        assert field.group(1) == shown, job.state
