"""A fair queue's job page in a real browser: the fairness key (and stamp) and the expiry
are shown, and the job list finds the job by its fairness key."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from tests.browser.test_admin_browser import PASSWORD, expect, log_in
from tests.testapp.jobs import FairWork

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_job_page_shows_the_fairness_key_and_the_expiry(page):
    deadline = timezone.now() + timedelta(hours=2)
    job = FairWork.dispatch("tenant:big", 7, expires_at=deadline)
    other = FairWork.dispatch("tenant:small", 8)

    User.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    log_in(page, "boss")
    page.goto(reverse("admin:django_gator_job_change", args=[job.pk]))
    fairness = page.locator(".field-fairness")
    expect(fairness).to_contain_text("tenant:big")
    expect(fairness).to_contain_text("in the fair queue fair")
    expect(page.locator(".field-expiry")).to_contain_text("not started by then, it never runs")
    expect(page.locator(".field-expiry")).to_contain_text(str(deadline.year))

    page.goto(reverse("admin:django_gator_job_changelist") + "?q=tenant:small")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(str(other.pk))
