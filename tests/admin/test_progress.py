"""Long-running jobs in the admin: the progress bar in the list and on the job's page, the
checkpoint redacted like the arguments, and the clear-checkpoint button (permission, CSRF,
POST, audit trail)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from django_gator.models import Job, JobState
from tests.admin_helpers import dead_job, operator
from tests.conftest import run_worker
from tests.testapp.long_jobs import DiesMidway, ManualCheckpoint

pytestmark = pytest.mark.django_db(transaction=True)


def _clear_url(job: Job) -> str:
    return reverse("admin:django_gator_job_clear_checkpoint", args=[job.pk])


def _page(client: Client, job: Job) -> str:
    return client.get(reverse("admin:django_gator_job_change", args=[job.pk])).content.decode()


def test_the_list_and_the_page_show_a_running_jobs_progress():
    job = dead_job(
        state=JobState.RUNNING,
        reserved_by="w",
        locked_at="2026-01-01T00:00:00Z",
        progress={"done": 30, "total": 120, "note": "<b>rows</b>", "rate": 3.0, "at": "t"},
    )
    viewer = operator()
    listing = viewer.get(reverse("admin:django_gator_job_changelist")).content.decode()
    assert '<progress class="gator-progress" max="100" value="25.0"' in listing
    assert "30 / 120 (25 %)" in listing
    page = _page(viewer, job)
    assert "3 per second" in page
    assert "about 30s left" in page
    assert "&lt;b&gt;rows&lt;/b&gt;" in page
    assert "<b>rows</b>" not in page
    # Without a total: an indeterminate bar and no time left.
    Job.objects.filter(pk=job.pk).update(progress={"done": 7, "total": None, "note": ""})
    page = _page(viewer, job)
    assert '<progress class="gator-progress" title="">' in page
    assert "left" not in page.split("gator-progress-details")[1].split("</p>")[0]


def test_the_checkpoint_is_redacted_and_cleared_by_a_permitted_post():
    job = ManualCheckpoint.dispatch(10, fail_at=4)
    run_worker("long", concurrency=1)
    job.refresh_from_db()
    assert job.checkpoint_data == {"row": 10, "password": "s3cret"}
    url = _clear_url(job)

    viewer = operator()
    page = _page(viewer, job)
    assert "s3cret" not in page  # redacted like arguments (GATOR_REDACT has "password")
    assert "&quot;row&quot;: 10" in page
    assert "gator-clear-checkpoint" not in page  # no retry permission, no button
    assert viewer.post(url).status_code == 403
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="op"))
    assert strict.post(url).status_code == 403
    retrier = operator("retry_job", name="op2")
    assert retrier.get(url).status_code == 405  # GET changes nothing
    assert Job.objects.get(pk=job.pk).checkpoint_data is not None
    assert "gator-clear-checkpoint" in _page(retrier, job)

    response = retrier.post(url, follow=True)
    assert "Checkpoint cleared" in response.content.decode()
    job.refresh_from_db()
    assert job.checkpoint_data is None
    assert job.audit[-1]["action"] == "clear checkpoint"
    assert job.audit[-1]["by"] == "op2"
    assert "None: the next attempt starts from scratch." in _page(retrier, job)


def test_a_running_jobs_checkpoint_is_not_cleared():
    job = dead_job(
        state=JobState.RUNNING, reserved_by="w", locked_at="2026-01-01T00:00:00Z",
        checkpoint_data={"row": 3},
    )  # fmt: skip
    retrier = operator("retry_job")
    assert "gator-clear-checkpoint" not in _page(retrier, job)
    response = retrier.post(_clear_url(job), follow=True)
    assert "Nothing cleared" in response.content.decode()
    assert Job.objects.get(pk=job.pk).checkpoint_data == {"row": 3}
    assert not Job.objects.get(pk=job.pk).audit


def test_an_operators_retry_resumes_a_dead_job_from_its_checkpoint():
    job = DiesMidway.dispatch(20, fail_at=8)
    run_worker("long", concurrency=1)
    job.refresh_from_db()
    assert job.state == JobState.DEAD
    assert job.checkpoint_data == {"each": 8}
    retrier = operator("retry_job")
    retrier.post(reverse("admin:django_gator_job_retry", args=[job.pk]))
    assert Job.objects.get(pk=job.pk).state == JobState.WAITING
    run_worker("long", concurrency=1)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert job.result == 8
