"""The workflow page in a real browser: from a step's job page to its workflow's graph,
each step drawn with its state, and from a step's box back to its job; a wait step
approved with the page's Approve button."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from django_gator import Workflow
from django_gator.models import Job, WorkflowRun, WorkflowStep
from tests.browser.test_admin_browser import PASSWORD, log_in
from tests.conftest import run_worker
from tests.testapp.jobs import DagStep, Gathers, Produces

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


def test_a_batch_step_leads_to_its_batch_whose_retry_brings_the_workflow_back(page, screenshot):
    """A batch step drawn with its members' progress; its box leads to its batch's page,
    which leads back to the workflow; retrying the dead member there (it then succeeds)
    lets the steps it had cancelled run."""
    User.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    wf = Workflow(name="album 7")
    fetch = wf.add(DagStep, 0)
    resize = wf.add_batch(
        DagStep,
        [{"node": 1, "member": m, "fail_until": 3 if m == 2 else 0} for m in range(4)],
        after=[fetch],
    )
    wf.add(DagStep, 2, after=[resize])
    run = wf.dispatch()
    run_worker(concurrency=2)
    log_in(page, "boss")

    page.goto(reverse("admin:django_gator_workflowrun_change", args=[run.pk]))
    graph = page.locator("svg.gator-workflow")
    batch_step = graph.locator('g.gator-batch-step[data-position="1"]')
    expect(batch_step).to_have_attribute("data-state", "dead")
    expect(batch_step).to_contain_text("3/4 succeeded")
    expect(graph.locator('g.gator-step[data-position="2"]')).to_have_attribute(
        "data-state", "cancelled"
    )
    screenshot(page, "workflow-batch-step")

    batch_step.locator("a").click()
    batch_id = WorkflowStep.objects.get(workflow=run, position=1).batch_id
    expect(page).to_have_url(reverse("admin:django_gator_job_batch", args=[batch_id]))
    expect(page.locator("#gator-batch-ended")).to_contain_text("4 / 4 ended (100%)")
    page.get_by_role("button", name="Retry the dead members").click()
    expect(page.locator(".messagelist")).to_contain_text("1 dead member(s)")

    run_worker()
    page.locator("#gator-batch-workflow a").click()
    expect(page).to_have_url(reverse("admin:django_gator_workflowrun_change", args=[run.pk]))
    steps = page.locator("svg.gator-workflow g.gator-step")
    expect(steps).to_have_count(3)
    states = {
        step.get_attribute("data-position"): step.get_attribute("data-state")
        for step in steps.all()
    }
    assert states == {"0": "succeeded", "1": "succeeded", "2": "succeeded"}
    expect(page.locator('g.gator-batch-step[data-position="1"]')).to_contain_text("4/4 succeeded")


def _approval_run(name: str) -> WorkflowRun:
    wf = Workflow(name=name)
    wf.add(Produces, {"order": 42}, name="merge")
    wf.add_wait("approved", after=["merge"], timeout=timedelta(days=3), name="approval")
    wf.add(Gathers, "ship", after=["approval"], name="ship")
    run = wf.dispatch()
    run_worker("results")  # merge runs; the approval waits for its signal
    return run


def test_approve_on_the_workflow_page_releases_the_wait_for_a_user_allowed_to(page):
    """A staff user with the signal permission approves the wait with a note (a real POST
    through the page's form, its CSRF token included); the payload reaches the step after
    it, and the page then shows who approved. A user without the permission sees the wait
    but no buttons."""
    run = _approval_run("order 42")
    ana = User.objects.create_user("ana", password=PASSWORD, is_staff=True)
    ana.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="django_gator",
            codename__in=["view_workflowrun", "signal_workflow"],
        )
    )
    viewer = User.objects.create_user("viewer", password=PASSWORD, is_staff=True)
    viewer.user_permissions.add(
        Permission.objects.get(content_type__app_label="django_gator", codename="view_workflowrun")
    )
    url = reverse("admin:django_gator_workflowrun_change", args=[run.pk])

    log_in(page, "viewer")
    page.goto(url)
    waits = page.locator("table.gator-workflow-waits")
    expect(waits).to_contain_text("approved")
    expect(waits.get_by_role("button", name="Approve")).to_have_count(0)
    page.context.clear_cookies()

    log_in(page, "ana")
    page.goto(url)
    waits = page.locator("table.gator-workflow-waits")
    expect(waits).to_contain_text("released")
    waits.get_by_placeholder("note").fill("checked the stock")
    waits.get_by_role("button", name="Approve").click()

    expect(page.locator("ul.messagelist")).to_contain_text("Approved 'approved'")
    expect(page).to_have_url(url)
    expect(page.locator("table.gator-workflow-waits")).to_contain_text("received at")
    expect(page.locator("table.gator-workflow-waits")).to_contain_text("by ana")
    expect(page.locator("table.gator-workflow-waits").get_by_role("button")).to_have_count(0)
    run.refresh_from_db()
    assert run.signals["approved"]["by"] == "ana"
    payload = {"approved": True, "by": "ana", "note": "checked the stock"}
    assert run.signals["approved"]["payload"] == payload

    run_worker("results")
    assert run.wait_result(timeout=5) == {
        "ship": {"results": {"approval": payload}, "extra": "ship"}
    }
    page.reload()
    expect(page.locator('svg.gator-workflow g.gator-step[data-position="2"]')).to_have_attribute(
        "data-state", "succeeded"
    )
