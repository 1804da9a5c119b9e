"""The admin's lists fit 1280 and 1400 pixel windows, with the navigation sidebar open (the
admin's default) and the filters beside them: every column inside the window, nothing
scrolled sideways, no header cut. On Django 5.2 and 6.1 alike (their CSS differs)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from django_gator.models import Worker
from tests.browser.test_admin_browser import PASSWORD, dead_jobs, log_in
from tests.factories import WorkerFactory
from tests.testapp.jobs import Boom, add

pytestmark = pytest.mark.django_db(transaction=True)

WIDTHS = [1280, 1400]


def assert_fits(page: Any, column: str) -> None:
    """Every header of the list, ``column`` included, ends inside the list's box and the
    window, and neither the page nor the list scrolls sideways."""
    from playwright.sync_api import expect

    expect(page.locator("#nav-sidebar")).to_be_visible()
    expect(page.locator("#changelist-filter")).to_be_visible()
    headers = page.locator("#result_list thead th")
    texts = [t.strip().lower() for t in headers.all_inner_texts()]
    assert column in texts, texts
    window = page.viewport_size["width"]
    results = page.locator("#changelist .results").bounding_box()
    for header in headers.all():
        box = header.bounding_box()
        assert box["x"] + box["width"] <= min(window, results["x"] + results["width"]) + 0.5, (
            header.inner_text(),
            box,
            results,
            window,
            [(h.inner_text(), round(h.bounding_box()["width"])) for h in headers.all()],
        )
    assert page.evaluate("document.documentElement.scrollWidth") <= window
    scroll = page.locator("#changelist .results").evaluate("el => el.scrollWidth - el.clientWidth")
    assert scroll <= 0, f"the list scrolls sideways by {scroll} px"


@pytest.mark.parametrize("width", WIDTHS)
def test_the_job_list_fits_with_a_long_last_error(page, width):
    User.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    dead_jobs()
    Boom.dispatch("disk full: " + "the volume /var/lib/data has no space left " * 12)
    add.dispatch(2, 3, priority=7, queue="a-rather-long-queue-name-for-reports", wait=3600)

    page.set_viewport_size({"width": width, "height": 900})
    log_in(page, "boss")
    page.goto(reverse("admin:django_gator_job_changelist"))

    assert_fits(page, "last error")


@pytest.mark.parametrize("width", WIDTHS)
def test_the_workers_list_fits_with_its_heartbeat_column(page, width):
    User.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    supervisor = "build-server-eu-west-1.internal:48211:supervisor"
    for n in range(3):
        WorkerFactory(
            id=f"build-server-eu-west-1.internal:{48212 + n}:{'a1b2c3d4' * 2}",
            hostname="build-server-eu-west-1.internal",
            supervisor=supervisor,
            queues=[["critical", 8], ["default", 2], ["emails", 1], ["exports", 1]],
            concurrency=16,
        )
    assert Worker.objects.count() == 3

    page.set_viewport_size({"width": width, "height": 900})
    log_in(page, "boss")
    page.goto(reverse("admin:django_gator_worker_changelist"))

    assert_fits(page, "heartbeat at")
