"""The batch page: counts, members by state, the retry of dead members (permission, CSRF,
POST only), and the job page's link to its batch."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from django_gator import Batch
from django_gator.models import Job, JobState
from django_gator.testing import run_jobs
from tests.admin_helpers import operator
from tests.testapp.jobs import BatchCompleted, Boom, Noop

pytestmark = pytest.mark.django_db(transaction=True)


def finished_batch() -> tuple[Batch, Job]:
    with Batch(on_complete=BatchCompleted, description="<script>x</script>") as batch:
        dead = Boom.dispatch()
        Noop.dispatch()
    Noop.dispatch()  # not a member
    run_jobs(raise_errors=False)
    return batch, dead


def url(batch: Batch) -> str:
    return reverse("admin:django_gator_job_batch", args=[batch.pk])


def test_the_page_shows_counts_and_filters_members_by_state():
    batch, dead = finished_batch()
    client = operator()
    page = client.get(url(batch)).content.decode()
    assert "&lt;script&gt;x&lt;/script&gt;" in page
    assert "<script>x" not in page
    assert "2 / 2 ended (100%)" in page
    assert page.count('class="gator-member ') == 2
    assert "Retry the dead members" not in page  # no retry permission
    only_dead = client.get(url(batch), {"state": "dead"}).content.decode()
    assert only_dead.count('class="gator-member ') == 1
    assert f"#{dead.pk}<" in only_dead
    assert client.get(url(batch), {"state": "bogus"}).status_code == 200
    missing = reverse("admin:django_gator_job_batch", args=[batch.pk + 1000])
    assert client.get(missing).status_code == 404

    job_page = client.get(reverse("admin:django_gator_job_change", args=[dead.pk]))
    assert f'href="{url(batch)}"' in job_page.content.decode()


def test_retrying_needs_the_permission_a_csrf_token_and_a_post():
    batch, dead = finished_batch()
    form = {"action": "retry_dead"}
    assert operator().post(url(batch), form).status_code == 403
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="op"))
    assert strict.post(url(batch), form).status_code == 403
    operator("retry_job", name="op2").get(url(batch), form)  # GET changes nothing
    assert Job.objects.get(pk=dead.pk).state == JobState.DEAD

    retrier = operator("retry_job", name="op3")
    assert "Retry the dead members" in retrier.get(url(batch)).content.decode()
    response = retrier.post(url(batch), form, follow=True)
    assert "1 dead member(s)" in response.content.decode()
    assert Job.objects.get(pk=dead.pk).state == JobState.WAITING
    assert Job.objects.get(pk=dead.pk).audit[-1]["by"] == "op3"
    assert Batch.objects.get(pk=batch.pk).generation == 2
