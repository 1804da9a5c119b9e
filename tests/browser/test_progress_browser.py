"""A running job's progress in a real browser (issue 35): a worker process runs a job that
reports progress through each(); the admin's job list and the job's page show its bar
moving."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from django_gator.models import Job, JobState
from tests.browser.test_admin_browser import PASSWORD, log_in
from tests.conftest import wait_for
from tests.testapp.long_jobs import CountsItems

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips, or fails under GATOR_BROWSER_TESTS=required
    expect = None

pytestmark = pytest.mark.django_db(transaction=True)


def done(job: Job) -> float:
    return float((Job.objects.get(pk=job.pk).progress or {}).get("done", 0))


def test_a_running_jobs_progress_bar_moves_in_the_admin(page, spawn_worker, screenshot):
    User.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    job = CountsItems.dispatch(400, pause=0.05)  # about 20 s of items
    log_in(page, "boss")
    spawn_worker("--queue", "long", "--concurrency", "1")
    wait_for(lambda: done(job) > 0, timeout=60)

    page.goto(reverse("admin:django_gator_job_changelist"))
    row = page.locator("#result_list tbody tr").filter(has_text=CountsItems.name)
    bar = row.locator("progress.gator-progress")
    expect(bar).to_be_visible()
    first = float(bar.get_attribute("value") or 0)
    assert 0 < first < 100
    expect(row.locator(".gator-progress-text")).to_contain_text("/ 400")

    # Further along, on the job's page: the bar has moved, with the note and the rate.
    wait_for(lambda: done(job) >= first * 4 + 20, timeout=60)
    page.goto(reverse("admin:django_gator_job_change", args=[job.pk]))
    bar = page.locator(".field-progress_html progress.gator-progress")
    expect(bar).to_be_visible()
    assert float(bar.get_attribute("value") or 0) > first
    expect(page.locator(".gator-progress-details")).to_contain_text("each")
    expect(page.locator(".gator-progress-details")).to_contain_text("per second")
    screenshot(page, "job-progress")
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
