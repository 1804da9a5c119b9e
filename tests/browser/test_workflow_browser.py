"""The workflow page in a real browser: from a step's job page to its workflow's graph,
each step drawn with its state, and from a step's box back to its job."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from django_gator import Workflow
from django_gator.models import Job
from tests.browser.test_admin_browser import PASSWORD, log_in
from tests.conftest import run_worker
from tests.testapp.jobs import DagStep

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips, or fails under GATOR_BROWSER_TESTS=required
    expect = None

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_workflow_page_draws_each_step_with_its_state(page, screenshot):
    User.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    wf = Workflow(name="order 42")
    fetch_a = wf.add(DagStep, 0)
    fetch_b = wf.add(DagStep, 1, fail_until=99)  # dies: what follows it is cancelled
    merge = wf.add(DagStep, 2, after=[fetch_a, fetch_b])
    wf.add(DagStep, 3, after=[merge])
    wf.add(DagStep, 4, after=[fetch_a])
    run = wf.dispatch()
    run_worker(concurrency=2)
    log_in(page, "boss")

    # The job page of a step links to its workflow.
    first = Job.objects.get(chain_id=run.id, chain_position=0)
    page.goto(reverse("admin:django_gator_job_change", args=[first.pk]))
    page.get_by_role("link", name=str(run.id)).click()

    expect(page.locator("#content h2, #content-main").first).to_be_visible()
    graph = page.locator("svg.gator-workflow")
    expect(graph).to_be_visible()
    states = {
        step.get_attribute("data-position"): step.get_attribute("data-state")
        for step in graph.locator("g.gator-step").all()
    }
    assert states == {
        "0": "succeeded",
        "1": "dead",
        "2": "cancelled",
        "3": "cancelled",
        "4": "succeeded",
    }
    assert graph.locator("path[marker-end]").count() == 4  # one arrow per dependency
    table = page.locator("table.gator-workflow-steps")
    dead_job = Job.objects.get(chain_id=run.id, chain_position=1)
    expect(table).to_contain_text(
        f"step 1 (tests.testapp.jobs.DagStep, job {dead_job.pk}) ended dead"
    )
    screenshot(page, "workflow")

    # A step's box leads to its job.
    graph.locator('g.gator-step[data-position="1"] a').click()
    expect(page).to_have_url(reverse("admin:django_gator_job_change", args=[dead_job.pk]))
