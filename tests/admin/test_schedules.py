"""The schedule admin."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_gator.models import Job, Schedule
from tests.admin_helpers import staff
from tests.testapp.jobs import Noop

pytestmark = pytest.mark.django_db


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
