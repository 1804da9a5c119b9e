"""An encrypted job's page in a real browser: a user without ``view_encrypted`` sees
``[encrypted]`` in place of its arguments, result, checkpoint and error texts; a user with
it sees them decrypted."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from django_gator.testing import run_jobs
from tests.browser.test_admin_browser import PASSWORD, expect, log_in
from tests.testapp.jobs import SecretRecord

pytestmark = pytest.mark.django_db(transaction=True)

CARD = "4111-2222-3333-4444"


def user(name: str, *codenames: str) -> None:
    staff = User.objects.create_user(name, password=PASSWORD, is_staff=True)
    for codename in ("view_job", *codenames):
        staff.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_gator", codename=codename)
        )


def test_the_job_page_hides_encrypted_data_unless_the_user_may_see_it(page, browser, live_server):
    failed = SecretRecord.dispatch(CARD, fail=True)
    done = SecretRecord.dispatch(CARD)
    run_jobs(raise_errors=False)
    user("viewer")
    user("reader", "view_encrypted")

    log_in(page, "viewer")
    page.goto(reverse("admin:django_gator_job_change", args=[failed.pk]))
    content = page.locator("#content-main")
    expect(page.locator(".field-args_pretty")).to_contain_text("[encrypted]")
    expect(page.locator(".field-kwargs_pretty")).to_contain_text("[encrypted]")
    expect(page.locator(".field-checkpoint_html")).to_contain_text("[encrypted]")
    expect(page.locator(".field-last_error_shown")).to_contain_text("ValueError: [encrypted]")
    expect(content).not_to_contain_text(CARD)
    page.locator(".field-error_history_html details").first.locator("summary").click()
    expect(content).not_to_contain_text(CARD)
    page.goto(reverse("admin:django_gator_job_change", args=[done.pk]))
    expect(page.locator(".field-result_pretty")).to_contain_text("[encrypted]")
    expect(page.locator("#content-main")).not_to_contain_text(CARD)
    page.goto(reverse("admin:django_gator_job_changelist") + f"?q={CARD}")
    expect(page.locator("#result_list tbody tr")).to_have_count(0)

    reader = browser.new_context(base_url=live_server.url).new_page()
    try:
        log_in(reader, "reader")
        reader.goto(reverse("admin:django_gator_job_change", args=[failed.pk]))
        expect(reader.locator(".field-args_pretty")).to_contain_text(CARD)
        expect(reader.locator(".field-checkpoint_html")).to_contain_text(CARD)
        history = reader.locator(".field-error_history_html details").first
        expect(history.locator("summary")).to_contain_text(f"card {CARD} was declined")
        history.locator("summary").click()
        expect(history.locator("pre")).to_contain_text("ValueError")
        reader.goto(reverse("admin:django_gator_job_change", args=[done.pk]))
        expect(reader.locator(".field-result_pretty")).to_contain_text(CARD)
    finally:
        reader.context.close()
