"""The job page shows which unique key a job holds, under which window and until when, and
its expiry (or that it expired)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_gator import conf
from django_gator.dbtime import DbNow
from django_gator.expiry import settle_expired
from django_gator.models import Job, JobState
from tests.admin_helpers import operator
from tests.test_windows import Digest, Reindex, Webhook

pytestmark = pytest.mark.django_db(transaction=True)


def _page(client: Client, job: Job) -> str:
    return client.get(reverse("admin:django_gator_job_change", args=[job.pk])).content.decode()


def test_the_page_shows_the_key_and_until_when_it_is_taken():
    viewer = operator()
    webhook = Webhook.dispatch("evt_<9>")
    page = _page(viewer, webhook)
    assert "<code>event:evt_&lt;9&gt;</code>" in page
    assert "then for 1h00m after it finishes (unique_for)" in page
    finished = timezone.now().replace(microsecond=0)
    Job.objects.filter(pk=webhook.pk).update(state=JobState.SUCCEEDED, finished_at=finished)
    until = timezone.localtime(finished + timedelta(hours=1)).strftime("%H:%M:%S")
    page = _page(viewer, webhook)
    assert "taken until" in page
    assert until in page

    reindex = Reindex.dispatch(4)
    start = timezone.localtime(Job.objects.get(pk=reindex.pk).next_execution_at)
    page = _page(viewer, reindex)
    assert "dispatches of the key replace its arguments until it starts" in page
    assert start.strftime("%H:%M:%S") in page

    digest = Digest.dispatch(3)
    assert "join it until it starts" in _page(viewer, digest)


def test_the_page_shows_the_expiry_and_an_expired_job():
    viewer = operator()
    deadline = timezone.now() + timedelta(minutes=5)
    job = Webhook.dispatch("evt_x", expires_at=deadline)
    page = _page(viewer, job)
    assert "not started by then, it never runs" in page
    Job.objects.filter(pk=job.pk).update(expires_at=DbNow() - timedelta(seconds=1))
    assert settle_expired(conf.database()) == 1
    page = _page(viewer, job)
    assert "expired: never run" in page
    assert "django_gator.exceptions.JobExpired" in page
