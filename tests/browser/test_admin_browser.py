"""The admin screens in a real browser: log in through the login form, retry a group of dead
jobs on the dead-job screen, watch a real worker run them again, and check that a view-only
user can neither see nor forge a retry.

GATOR_SCREENSHOTS=1 also saves the README's screenshots into docs/screenshots/.
"""

from __future__ import annotations

import re
from typing import Any

import django
import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from django_gator.models import FinishedTally, Job, JobState
from tests.conftest import SECRET, dead_jobs_for_operators, run_worker, wait_for, worker_output
from tests.testapp.jobs import Boom, FailsFirstTime, Noop, add

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips, or fails under GATOR_BROWSER_TESTS=required
    expect = None

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct horse battery staple"
DEAD = "admin:django_gator_job_dead"
CHANGELIST = "admin:django_gator_job_changelist"
#: How the breadcrumbs separate their items, as text.
SEP = " \N{SINGLE RIGHT-POINTING ANGLE QUOTATION MARK} "


def dead_jobs() -> None:
    dead_jobs_for_operators()
    assert Job.objects.filter(state=JobState.DEAD).count() == 5


def log_in(page: Any, username: str) -> None:
    """Through the admin's login form, like a person."""
    page.goto(reverse("admin:login"))
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("#user-tools")).to_contain_text(username)
    expect(page.locator("#site-name")).to_be_visible()


def job_rows() -> list[tuple[Any, ...]]:
    return list(
        Job.objects.order_by("id").values_list(
            "id", "state", "queue", "attempts", "next_execution_at", "audit", "errors"
        )
    )


def test_retrying_a_dead_group_runs_it_again_on_a_worker_and_keeps_its_history(
    page, spawn_worker, screenshot
):
    User.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    dead_jobs()
    logins = Job.objects.filter(name=FailsFirstTime.name)
    alice = logins.get(args=["alice"])
    add.dispatch(2, 3)  # more life on the screenshots: a job that just runs,
    Noop.dispatch(wait=3600)  # and one scheduled for later

    log_in(page, "boss")
    page.locator("tr.model-job th a").click()  # Site administration -> Jobs
    page.get_by_role("link", name="Dead jobs").click()
    expect(page).to_have_url(re.compile(re.escape(reverse(DEAD)) + "$"))

    groups = page.locator("tr.gator-group")
    expect(groups).to_have_count(2)
    expect(page.locator(".gator-total")).to_have_text("5 jobs match in 2 groups.")
    login_group = groups.filter(has_text="PermissionError")
    expect(login_group.locator(".gator-count")).to_have_text("3")
    expect(login_group.locator(".gator-message")).to_contain_text("[redacted]")
    expect(groups.filter(has_text="RuntimeError").locator(".gator-count")).to_have_text("2")
    expect(page.locator("#content-main")).not_to_contain_text(SECRET)
    screenshot(page, "dead-jobs")

    login_group.get_by_role("button", name="Retry group").click()
    expect(page.locator("#content-main")).to_contain_text("Retry 3 jobs?")
    expect(page.locator("#content-main li")).to_have_text(
        [
            re.compile(
                f"3 \N{MULTIPLICATION SIGN} {re.escape(FailsFirstTime.name)} · PermissionError"
            )
        ]
    )
    assert Job.objects.filter(state=JobState.DEAD).count() == 5  # asking changes nothing

    page.get_by_role("button", name="Yes, I'm sure").click()
    expect(page.locator("ul.messagelist")).to_contain_text("3 job(s) queued to run again.")
    expect(page).to_have_url(re.compile(re.escape(reverse(DEAD))))
    expect(groups).to_have_count(1)
    expect(groups.first).to_contain_text("RuntimeError")
    assert set(logins.values_list("state", flat=True)) == {JobState.WAITING}
    assert Job.objects.filter(name=Boom.name, state=JobState.DEAD).count() == 2

    worker = spawn_worker("--concurrency", "2")
    try:
        wait_for(
            lambda: (
                logins.filter(state=JobState.SUCCEEDED).count() == 3
                and Job.objects.filter(name=add.name, state=JobState.SUCCEEDED).exists()
            ),
            timeout=60,
        )
    except AssertionError:
        pytest.fail(
            f"the worker did not run the retried jobs; its output:\n{worker_output(worker)}"
        )

    # The job list, reloaded, shows them succeeded on their second attempt.
    page.goto(f"{reverse(CHANGELIST)}?name={FailsFirstTime.name}&state__exact=succeeded")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(3)
    for row in rows.all():
        expect(row.locator("td.field-state")).to_have_text("Succeeded")
        expect(row.locator("td.field-attempts")).to_have_text("2")

    # The detail page keeps the first attempt's error, with its traceback.
    rows.get_by_role("link", name=str(alice.pk), exact=True).click()
    expect(page.locator("div.field-state .readonly")).to_have_text("Succeeded")
    expect(page.locator("div.field-result_pretty")).to_contain_text("ok on attempt 2")
    history = page.locator("fieldset").filter(has=page.locator("div.field-error_history_html"))
    expect(history.locator("h2")).to_have_text("Error history")
    entries = history.locator("details")
    expect(entries).to_have_count(1)
    expect(entries.locator("summary")).to_contain_text("Attempt 1")
    expect(entries.locator("summary")).to_contain_text(
        "PermissionError: login failed for alice with password [redacted]"
    )
    expect(entries.locator("pre")).to_be_hidden()
    entries.locator("summary").click()
    expect(entries.locator("pre")).to_be_visible()
    expect(entries.locator("pre")).to_contain_text("Traceback (most recent call last)")
    expect(page.locator("div.field-audit_html")).to_contain_text("retry by boss")
    expect(page.locator("#content-main")).not_to_contain_text(SECRET)
    screenshot(page, "error-history")

    alice.refresh_from_db()
    assert (alice.state, alice.attempts, alice.result) == (
        JobState.SUCCEEDED,
        2,
        "ok on attempt 2",
    )
    assert len(alice.errors) == 1

    page.goto(reverse(CHANGELIST))
    expect(page.locator("#result_list tbody tr")).to_have_count(7)
    screenshot(page, "changelist")

    # The hour counts attempts as the workers wrote them (django_gator.tallies): five
    # deaths (the three logins before their retry, the two booms) and four successes,
    # which the spawned worker writes at its next heartbeat.
    wait_for(
        lambda: sum(FinishedTally.objects.values_list("succeeded", flat=True)) == 4, timeout=30
    )
    page.goto(reverse("admin:django_gator_job_dashboard"))
    expect(page.locator("#content-main h2").filter(has_text="Last hour")).to_have_text(
        "Last hour: 4 succeeded, 5 dead"
    )
    expect(page.locator("#gator-workers tbody tr")).to_have_count(1)
    expect(page.locator("#gator-workers tbody")).not_to_contain_text("No live worker.")
    expect(page.locator("svg.gator-chart")).to_be_visible()
    expect(page.locator("svg.gator-chart .gator-legend text")).to_have_text(["succeeded", "dead"])
    expect(page.locator("svg.gator-chart .gator-x-axis text").last).to_have_text("time (UTC)")
    screenshot(page, "dashboard")


def test_a_view_only_user_gets_no_retry_button_and_a_forged_retry_is_refused(page, live_server):
    dead_jobs()
    viewer = User.objects.create_user("viewer", password=PASSWORD, is_staff=True)
    viewer.user_permissions.add(
        Permission.objects.get(content_type__app_label="django_gator", codename="view_job")
    )
    before = job_rows()

    log_in(page, "viewer")
    page.goto(reverse(DEAD))
    expect(page.locator("tr.gator-group")).to_have_count(2)
    expect(page.get_by_role("button", name="Retry group")).to_have_count(0)
    expect(
        page.locator(".gator-retry-group, .gator-discard-group, .gator-retry-all")
    ).to_have_count(0)
    expect(page.locator("#content-main form[method=post]")).to_have_count(0)

    page.goto(reverse(CHANGELIST))
    expect(page.locator("#result_list tbody tr")).to_have_count(5)
    expect(page.locator("select[name=action] option[value=retry_jobs]")).to_have_count(0)

    # Forged requests with the viewer's session and a valid CSRF token.
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    url = live_server.url
    name = FailsFirstTime.name
    for form in (
        {"action": "retry", "state": "dead", "name": name, "error_class": "PermissionError"},
        {"action": "retry", "state": "dead", "confirm": "yes"},
        {"action": "retry", "state": "both", "name": name, "confirm": "yes"},
        {"action": "discard", "state": "dead", "confirm": "yes"},
    ):
        response = page.request.post(
            url + reverse(DEAD), form={**form, "csrfmiddlewaretoken": token}
        )
        assert response.status == 403, (form, response.status, response.text()[:500])
        assert "CSRF" not in response.text()
    # The job list's retry action, forged, is not there for this user either.
    alice = Job.objects.get(name=name, args=["alice"])
    response = page.request.post(
        url + reverse(CHANGELIST),
        form={
            "action": "retry_jobs",
            "_selected_action": str(alice.pk),
            "index": "0",
            "post": "yes",
            "csrfmiddlewaretoken": token,
        },
    )
    assert "queued to run again" not in response.text()
    response = page.request.get(
        url + reverse("admin:django_gator_job_edit_arguments", args=[alice.pk])
    )
    assert response.status == 403
    assert job_rows() == before

    # The token was good: the same one logs the viewer out (refusals above were permissions).
    response = page.request.post(url + reverse("admin:logout"), form={"csrfmiddlewaretoken": token})
    assert response.status == 200
    assert "Logged out" in response.text()


def breadcrumbs_of(page: Any) -> dict[str, str]:
    """The breadcrumbs bar of the page: its element, class, background and text."""
    bar = page.locator("nav[aria-label=Breadcrumbs] .breadcrumbs")
    expect(bar).to_have_count(1)
    return bar.evaluate(
        """(el) => ({
            tag: el.tagName.toLowerCase(),
            background: getComputedStyle(el).backgroundColor,
            padding: getComputedStyle(el).paddingLeft,
            // An <ol>'s separators are CSS (::after): join its items as a <div> shows them.
            text: (el.tagName === "OL"
                ? Array.from(el.children, (li) => li.innerText.trim()).join(" \u203a ")
                : el.innerText
            ).replace(/\\s+/g, " ").trim(),
            current: el.querySelector("[aria-current=page]")?.innerText.trim() ?? null,
        })"""
    )


def test_the_custom_pages_have_the_admins_own_styled_breadcrumbs(page):
    """Each of our pages renders the breadcrumbs as Django's own pages do on this Django line
    (a <div> up to 6.0, an <ol> of <li> from 6.1, which styles only ol.breadcrumbs)."""
    User.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    groups = dead_jobs_for_operators()
    job = groups["logins"][0]
    log_in(page, "boss")

    page.goto(reverse("admin:django_gator_job_change", args=[job.pk]))
    django_own = breadcrumbs_of(page)  # Django's change_form.html
    assert django_own["background"] not in ("rgba(0, 0, 0, 0)", "transparent"), django_own
    expected_tag = "ol" if django.VERSION >= (6, 1) else "div"
    assert django_own["tag"] == expected_tag

    def check(what: str, trail: str) -> None:
        ours = breadcrumbs_of(page)
        assert (ours["tag"], ours["background"], ours["padding"]) == (
            django_own["tag"],
            django_own["background"],
            django_own["padding"],
        ), (what, ours, django_own)
        assert ours["text"] == trail, (what, ours)
        if expected_tag == "ol":
            assert ours["current"] == trail.rsplit(SEP, 1)[-1], (what, ours)

    sep = SEP
    home = f"Home{sep}Background jobs"
    page.goto(reverse(DEAD))
    check("dead jobs", f"{home}{sep}Jobs{sep}Dead jobs")
    page.get_by_role("button", name="Retry group").first.click()
    expect(page.locator("#content-main")).to_contain_text("Retry")
    check("dead jobs confirmation", f"{home}{sep}Jobs{sep}Dead jobs{sep}Are you sure?")
    page.goto(reverse("admin:django_gator_job_dashboard"))
    check("dashboard", f"{home}{sep}Jobs{sep}Job dashboard")
    page.goto(reverse("admin:django_gator_job_edit_arguments", args=[job.pk]))
    check("edit arguments", f"{home}{sep}Jobs{sep}{job}{sep}Edit arguments")
    page.goto(reverse(CHANGELIST))
    page.locator(f"input.action-select[value='{job.pk}']").check()
    page.locator("select[name=action]").select_option("retry_jobs")
    page.locator("button[name=index]").click()
    expect(page.locator("#content-main")).to_contain_text("Retry 1 selected job(s)?")
    check("action confirmation", f"{home}{sep}Jobs{sep}Are you sure?")


def test_the_job_list_fits_a_1400_pixel_window_and_shows_what_the_readme_promises(page):
    """At 1400 px, with the navigation sidebar open (the default) and the filters beside the
    list, every column is inside the window; the priority column is there, times have
    seconds, and a job that succeeded on a retry shows no "last error"."""
    User.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    Boom.dispatch("disk full: " + "the volume /var/lib/data has no space left " * 12)
    groups = dead_jobs_for_operators()
    bob = next(j for j in groups["logins"] if j.args == ["bob"])
    Job.objects.filter(pk=bob.pk).retry(by="boss")
    run_worker()
    bob.refresh_from_db()
    assert (bob.state, bob.last_error != "") == (JobState.SUCCEEDED, True)
    add.dispatch(2, 3, priority=7, wait=3600)

    page.set_viewport_size({"width": 1400, "height": 900})
    log_in(page, "boss")
    page.goto(reverse(CHANGELIST))
    expect(page.locator("#nav-sidebar")).to_be_visible()
    expect(page.locator("#changelist-filter")).to_be_visible()
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(7)

    headers = page.locator("#result_list thead th")
    window = page.viewport_size["width"]
    results = page.locator("#changelist .results").bounding_box()
    last = headers.last.bounding_box()
    assert last["x"] + last["width"] <= min(window, results["x"] + results["width"]) + 0.5, (
        last,
        results,
        headers.all_inner_texts(),
    )
    assert page.evaluate("document.documentElement.scrollWidth") <= window
    scroll = page.locator("#changelist .results").evaluate("el => el.scrollWidth - el.clientWidth")
    assert scroll <= 0, f"the job list scrolls sideways by {scroll} px"
    assert "priority" in [t.strip().lower() for t in headers.all_text_contents()]

    row = rows.filter(has=page.get_by_role("link", name=str(bob.pk), exact=True))
    expect(row.locator("td.field-state")).to_have_text("Succeeded")
    expect(row.locator("td.field-error_summary")).to_have_text("-")
    dead = rows.filter(has_text="disk full: the volume")
    expect(dead.locator("td.field-error_summary")).to_contain_text("RuntimeError: disk full")
    scheduled = rows.filter(has=page.locator("td.field-priority", has_text="7"))
    expect(scheduled).to_have_count(1)
    expect(scheduled.locator("td.field-next_run")).to_have_text(
        re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")
    )


def test_the_retry_button_on_a_dead_jobs_page_retries_it(page):
    User.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    groups = dead_jobs_for_operators()
    carol = next(j for j in groups["logins"] if j.args == ["carol"])
    log_in(page, "boss")
    detail = reverse("admin:django_gator_job_change", args=[carol.pk])

    page.goto(detail)
    expect(page.locator("div.field-state .readonly")).to_have_text("Dead")
    expect(page.get_by_role("link", name="Edit arguments and retry")).to_be_visible()
    page.get_by_role("button", name="Retry", exact=True).click()

    expect(page.locator("ul.messagelist")).to_contain_text("1 job(s) queued to run again.")
    expect(page).to_have_url(re.compile(re.escape(detail) + "$"))
    expect(page.locator("div.field-state .readonly")).to_have_text("Waiting")
    expect(page.locator("div.field-audit_html")).to_contain_text("retry by boss")
    expect(page.get_by_role("button", name="Retry", exact=True)).to_have_count(0)
    carol.refresh_from_db()
    assert (carol.state, carol.attempts, len(carol.errors)) == (JobState.WAITING, 1, 1)
    assert [(e["action"], e["by"]) for e in carol.audit] == [("retry", "boss")]
    assert Job.objects.filter(state=JobState.DEAD).count() == 4


def test_pausing_and_resuming_a_queue_from_the_dashboard(page, spawn_worker):
    from django_gator.models import Queue

    user = User.objects.create_user("ops", password=PASSWORD, is_staff=True)
    for codename in ("view_job", "pause_queue"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    first = Noop.dispatch(queue="emails")
    log_in(page, "ops")
    page.goto(reverse("admin:django_gator_job_dashboard"))
    row = page.locator("#gator-queues tbody tr", has_text="emails")
    row.get_by_role("button", name="Pause").click()

    expect(page.locator("ul.messagelist")).to_contain_text("Queue emails paused")
    row = page.locator("#gator-queues tbody tr", has_text="emails")
    expect(row).to_contain_text("paused by ops")
    queue = Queue.objects.get(name="emails")
    assert (queue.paused, queue.paused_by) == (True, "ops")

    proc = spawn_worker("--concurrency", "2")
    other = Noop.dispatch(queue="other")
    wait_for(lambda: other.refresh_state() == JobState.SUCCEEDED)
    assert first.refresh_state() == JobState.WAITING, worker_output(proc)

    page.goto(reverse("admin:django_gator_job_dashboard"))
    page.locator("#gator-queues tbody tr", has_text="emails").get_by_role(
        "button", name="Resume"
    ).click()
    expect(page.locator("ul.messagelist")).to_contain_text("Queue emails resumed")
    wait_for(lambda: first.refresh_state() == JobState.SUCCEEDED, timeout=10)
    assert not Queue.objects.get(name="emails").paused
