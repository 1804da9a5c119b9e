"""Rolling deploys: a job whose name the claiming worker does not know (new code
dispatched it, old code claimed it) waits for a worker that knows it, without spending an
attempt, until GATOR_UNKNOWN_JOB_WINDOW; after that it ends dead."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from django_gator import Queueable
from django_gator.models import Job, JobState
from django_gator.queueable import unregister
from tests.conftest import run_worker
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)

NEW_NAME = "billing.jobs.SendInvoiceV2"


@override_settings(GATOR_UNKNOWN_JOB_WINDOW=600)
def test_an_unknown_name_waits_uncharged_then_runs_on_a_worker_that_knows_it(caplog):
    caplog.set_level(logging.WARNING, logger="django_gator")
    row = JobFactory(name=NEW_NAME, args=[42])

    run_worker()  # "old code": the name is not registered here

    row.refresh_from_db()
    assert row.state == JobState.FAILED
    assert row.attempts == 0
    wait = (row.next_execution_at - timezone.now()).total_seconds()
    assert 3 < wait <= 5
    assert row.last_error.startswith("django_gator.worker.execution.UnknownJobName: ")
    assert "GATOR_AUTODISCOVER" in row.last_error
    assert "`jobs`" in row.last_error
    [line] = [r.getMessage() for r in caplog.records if f"id={row.pk} " in r.getMessage()]
    assert "result=failed" in line
    # The line and the row agree: the attempt was given back, and the message is whole,
    # down to the fix it suggests and the wait.
    assert f" attempt={row.attempts} " in line
    assert " charged=no retry_in_s=" in line
    assert line.endswith(row.last_error)
    assert "GATOR_AUTODISCOVER" in line
    assert "runs older code than the dispatcher, or the job's module is not imported" in line

    class SendInvoiceV2(Queueable):  # "new code" deployed: the name is registered now
        name = NEW_NAME

        def handle(self, invoice_id: int) -> int:
            return invoice_id * 2

    try:
        Job.objects.filter(pk=row.pk).update(next_execution_at=timezone.now())
        run_worker()
    finally:
        unregister(NEW_NAME)

    row.refresh_from_db()
    assert row.state == JobState.SUCCEEDED
    assert row.result == 84
    assert row.attempts == 1  # the waits were not charged


@override_settings(GATOR_UNKNOWN_JOB_WINDOW=600)
def test_an_unknown_name_ends_dead_once_its_window_has_passed():
    row = JobFactory(
        name="os.system", args=["rm -rf /"], created_at=timezone.now() - timedelta(hours=1)
    )

    run_worker()

    row.refresh_from_db()
    assert row.state == JobState.DEAD
    assert (
        row.last_error
        == "django_gator.exceptions.JobNotRegistered: job name 'os.system' is not registered"
    )


@override_settings(GATOR_UNKNOWN_JOB_WINDOW=30)
def test_the_last_wait_ends_at_the_window():
    row = JobFactory(name=NEW_NAME, created_at=timezone.now() - timedelta(seconds=28))

    run_worker()

    row.refresh_from_db()
    assert row.state == JobState.FAILED
    wait = (row.next_execution_at - timezone.now()).total_seconds()
    assert 0 < wait <= 2.5


def test_a_suggestion_is_made_only_for_a_near_typo():
    far = JobFactory(name="tests.testapp.jobs.UnrelatedThing")
    near = JobFactory(name="tests.testapp.jobs.Ech")

    run_worker()

    far.refresh_from_db()
    near.refresh_from_db()
    assert "did you mean" not in far.last_error
    assert "did you mean 'tests.testapp.jobs.Echo'" in near.last_error


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("GATOR_UNKNOWN_JOB_WINDOW", -1, "GATOR_UNKNOWN_JOB_WINDOW must be at least 0, got -1"),
        ("GATOR_UNKNOWN_JOB_WINDOW", "soon", "GATOR_UNKNOWN_JOB_WINDOW must be a number"),
        ("GATOR_AUTODISCOVER", "tasks", "GATOR_AUTODISCOVER must be a list of module names"),
    ],
)
def test_the_deploy_settings_are_checked(setting, value, message):
    from django.core import checks

    with override_settings(**{setting: value}):
        messages = [e.msg for e in checks.run_checks() if e.id == "django_gator.E003"]

    assert any(message in m for m in messages), messages


def test_gator_autodiscover_adds_to_the_modules_imported_at_start_up(settings):
    from django_gator import conf

    settings.GATOR_AUTODISCOVER = ["background"]
    assert conf.autodiscover_modules()[0] == "jobs"
    assert conf.autodiscover_modules()[-1] == "background"
