"""The job list's retry and cancel actions: permissions, confirmation, CSRF."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from django_gator.models import Job, JobState
from tests.admin_helpers import dead_job, staff

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_gator_job_changelist"

DEAD = "admin:django_gator_job_dead"


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
