"""The batch page in a real browser: from a dead member's page to its batch, the counts
and progress, the members filtered by state, and the retry of the dead members."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from django_gator import Batch
from django_gator.models import Job, JobState
from django_gator.testing import run_jobs
from tests.browser.test_admin_browser import PASSWORD, log_in
from tests.testapp.jobs import BatchCompleted, Boom, Noop

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips, or fails under GATOR_BROWSER_TESTS=required
    expect = None

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_batch_page_retries_its_dead_member(page):
    User.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    with Batch(on_complete=BatchCompleted, description="album <b>7</b>") as batch:
        dead = Boom.dispatch()
        Noop.dispatch_many([[], [], []])
    run_jobs(raise_errors=False)
    assert Job.objects.get(pk=dead.pk).state == JobState.DEAD
    assert Batch.objects.get(pk=batch.pk).is_complete

    log_in(page, "boss")
    page.goto(reverse("admin:django_gator_job_change", args=[dead.pk]))
    page.locator("#gator-batch-link").click()
    expect(page).to_have_url(
        re.compile(re.escape(reverse("admin:django_gator_job_batch", args=[batch.pk])))
    )
    expect(page.locator("#content-main")).to_contain_text("album <b>7</b>")  # escaped
    expect(page.locator("#gator-batch-ended")).to_contain_text("4 / 4 ended (100%)")
    expect(page.locator(".gator-count-dead span")).to_have_text("1")
    expect(page.locator(".gator-count-succeeded span")).to_have_text("3")
    expect(page.locator("tr.gator-member")).to_have_count(4)

    page.locator(".gator-count-dead a").click()
    expect(page.locator("tr.gator-member")).to_have_count(1)
    expect(page.locator("tr.gator-member-dead")).to_contain_text(f"#{dead.pk}")

    page.get_by_role("button", name="Retry the dead members").click()
    expect(page.locator(".messagelist")).to_contain_text("1 dead member(s)")
    expect(page.locator(".gator-count-waiting span")).to_have_text("1")
    expect(page.locator("#gator-batch-ended")).to_contain_text("3 / 4 ended (75%)")
    expect(page.get_by_role("button", name="Retry the dead members")).to_have_count(0)

    row = Batch.objects.get(pk=batch.pk)
    assert (row.generation, row.completed_generation) == (2, 1)  # re-opened
    assert Job.objects.get(pk=dead.pk).audit[-1]["by"] == "boss"
    run_jobs(raise_errors=False)
    assert Job.objects.filter(name=BatchCompleted.name).count() == 2  # a new completion
