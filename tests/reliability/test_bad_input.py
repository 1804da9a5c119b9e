"""Bad input of RELIABILITY.md's table that other files do not cover: the admin's schedule
form for a bad schedule and for a schedule whose job is gone.

The system checks for bad settings, databases and schedules declared in code are tested in
tests/test_checks.py; dispatch arguments, options and the worker's command line in
tests/test_dispatch.py, tests/test_validation.py and tests/worker/test_supervisor.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from django_gator import Queueable
from django_gator.models import Schedule
from django_gator.queueable import registered_jobs, unregister
from tests.testapp.jobs import Noop


@pytest.fixture
def restore_registry() -> Iterator[None]:
    before = set(registered_jobs())
    yield
    for name in set(registered_jobs()) - before:
        unregister(name)


# -- the admin's schedule form ------------------------------------------------------------------

FORM = {
    "name": "nightly",
    "job_name": Noop.name,
    "cron": "0 3 * * *",
    "timezone": "UTC",
    "args": "[]",
    "kwargs": "{}",
    "queue": "",
    "priority": "",
    "enabled": "on",
    "misfire": "once",
    "catch_up_limit": "100",
    "overlap": "on",
}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("cron", "61 * * * *", "not a valid cron expression"),
        ("timezone", "Europe/Nowhere", "unknown time zone &#x27;Europe/Nowhere&#x27;"),
        ("job_name", "os.system", "os.system is not one of the available choices"),
    ],
)
def test_the_admin_shows_a_bad_schedule_field_next_to_it(field, value, message):
    client = Client()
    client.force_login(User.objects.create_superuser("admin", password="pw"))

    response = client.post(reverse("admin:django_gator_schedule_add"), {**FORM, field: value})

    assert response.status_code == 200
    body = response.content.decode()
    row = body.split(f"field-{field}", 1)[1].split('<div class="form-row', 1)[0]
    assert message in row
    assert not Schedule.objects.exists()


@pytest.mark.django_db
@pytest.mark.usefixtures("restore_registry")
def test_a_schedule_whose_job_is_no_longer_registered_cannot_be_saved_in_the_admin():
    class Retired(Queueable):
        name = "tests.reliability.test_bad_input.Retired"

        def handle(self) -> None:
            return None

    schedule = Schedule(name="old-report", job_name=Retired.name, cron="0 3 * * *")
    schedule.save()
    unregister(Retired.name)
    client = Client()
    client.force_login(User.objects.create_superuser("admin", password="pw"))
    url = reverse("admin:django_gator_schedule_change", args=[schedule.pk])

    page = client.get(url).content.decode()
    assert Retired.name in page  # shown as it is
    response = client.post(
        url, {**FORM, "name": "old-report", "job_name": Retired.name, "cron": "0 4 * * *"}
    )

    assert response.status_code == 200
    row = (
        response.content.decode().split("field-job_name", 1)[1].split('<div class="form-row', 1)[0]
    )
    assert "job name &#x27;tests.reliability.test_bad_input.Retired&#x27; is not registered" in row
    assert Schedule.objects.get().cron == "0 3 * * *"
