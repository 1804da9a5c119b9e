"""The dead-job screen: groups, retrying and discarding them, permissions, CSRF."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from django_gator.models import Job, JobState
from tests.admin_helpers import dead_jobs, operator
from tests.conftest import SECRET, plain_table_only, run_worker
from tests.testapp.jobs import Boom, FailsFirstTime

pytestmark = pytest.mark.django_db(transaction=True)

DEAD = "admin:django_gator_job_dead"


def test_dead_jobs_are_grouped_by_name_and_error_class():
    dead_jobs()
    page = operator().get(reverse(DEAD)).content.decode()

    assert "5 jobs match" in page
    assert "PermissionError" in page
    assert "RuntimeError" in page
    assert page.count('class="gator-group"') == 2
    assert "disk full again" in page  # the newest message of its group
    assert SECRET not in page  # the password is in the error message, and masked
    assert "[redacted]" in page
    assert "Retry group" not in page  # no retry permission


def test_retrying_a_group_asks_first_then_runs_it_again_keeping_history():
    groups = dead_jobs()
    client = operator("retry_job")
    form = {
        "action": "retry",
        "state": "dead",
        "name": FailsFirstTime.name,
        "error_class": "PermissionError",
        "target_queue": "recovery",
    }

    confirm = client.post(reverse(DEAD), form)
    assert confirm.status_code == 200
    assert "Retry 3 jobs" in confirm.content.decode()
    assert Job.objects.filter(state=JobState.DEAD).count() == 5

    done = client.post(reverse(DEAD), {**form, "confirm": "yes"})
    assert done.status_code == 302
    logins = Job.objects.filter(pk__in=[j.pk for j in groups["logins"]])
    assert set(logins.values_list("state", "queue")) == {(JobState.WAITING, "recovery")}
    assert Job.objects.filter(name=Boom.name, state=JobState.DEAD).count() == 2

    run_worker("recovery")
    for job in logins:
        job.refresh_from_db()
        assert (job.state, job.attempts, job.result) == (
            JobState.SUCCEEDED,
            2,
            "ok on attempt 2",
        )
        assert len(job.errors) == 1  # the first attempt's error is kept
        assert job.audit == [
            {"at": job.audit[0]["at"], "by": "op", "action": "retry", "queue": "recovery"}
        ]


def test_retry_all_matching_and_discard_with_a_record_of_who():
    dead_jobs()
    client = operator("retry_job", "cancel_job")
    client.post(
        reverse(DEAD),
        {"action": "discard", "state": "dead", "name": Boom.name, "confirm": "yes"},
    )
    booms = Job.objects.filter(name=Boom.name)
    assert set(booms.values_list("state", flat=True)) == {JobState.CANCELLED}
    assert all(job.audit[-1]["action"] == "discard" for job in booms)
    assert all(job.audit[-1]["by"] == "op" for job in booms)

    client.post(reverse(DEAD), {"action": "retry", "state": "dead", "confirm": "yes"})
    assert Job.objects.filter(state=JobState.WAITING).count() == 3


def test_changes_need_their_permission_and_a_csrf_token():
    dead_jobs()
    form = {"action": "retry", "state": "dead", "confirm": "yes"}
    assert operator().post(reverse(DEAD), form).status_code == 403
    assert (
        operator("retry_job", name="op2")
        .post(reverse(DEAD), {**form, "action": "discard"})
        .status_code
        == 403
    )

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="op2"))
    assert strict.post(reverse(DEAD), form).status_code == 403
    assert Job.objects.filter(state=JobState.DEAD).count() == 5
    # GET never changes anything, whatever its parameters.
    operator("retry_job", name="op3").get(reverse(DEAD), form)
    assert Job.objects.filter(state=JobState.DEAD).count() == 5


def test_a_bad_target_queue_is_refused_with_its_name():
    dead_jobs()
    response = operator("retry_job").post(
        reverse(DEAD),
        {"action": "retry", "state": "dead", "target_queue": "no spaces", "confirm": "yes"},
        follow=True,
    )
    assert "queue name &#x27;no spaces&#x27;" in response.content.decode()
    assert Job.objects.filter(state=JobState.DEAD).count() == 5


@plain_table_only
def test_the_dead_job_screens_index_holds_only_dead_and_failed_rows():
    from django.db import connection

    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, Job._meta.db_table)
    if connection.vendor == "mysql":
        assert "gator_job_groups" not in constraints  # no partial indexes there
        return
    assert constraints["gator_job_groups"]["columns"] == ["state", "name", "error_class"]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_get_indexdef('gator_job_groups'::regclass)")
            definition = cursor.fetchone()[0]
        assert "WHERE" in definition
        assert "dead" in definition


def test_a_group_filter_is_the_exact_recorded_class_and_a_bad_one_matches_nothing():
    dead_jobs()
    client = operator()
    # The recorded class is "PermissionError": its group, and not a suffix match.
    exact = client.get(reverse(DEAD), {"error_class": "PermissionError"}).content.decode()
    assert "PermissionError" in exact
    assert "RuntimeError" not in exact
    # A hand-edited URL naming no possible class: no jobs, and no server error.
    bad = client.get(reverse(DEAD), {"error_class": "not a class"})
    assert bad.status_code == 200
    assert "0 jobs match" in bad.content.decode()
