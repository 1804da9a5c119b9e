"""Long-running jobs (issue 35): progress written at a bounded rate, on the claim, and
shown in gator_status and the admin; checkpoints read back by the next attempt."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_gator.models import Job, JobState
from tests.conftest import run_worker
from tests.testapp.long_jobs import AtomicCheckpoint, ManualCheckpoint, ProgressStorm

pytestmark = pytest.mark.django_db(transaction=True)


@override_settings(GATOR_PROGRESS_INTERVAL=0.05)
def test_a_hundred_thousand_progress_calls_cost_a_bounded_number_of_updates():
    job = ProgressStorm.dispatch(100_000)
    run_worker("long", concurrency=1)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    updates, seconds = job.result["updates"], job.result["seconds"]
    # One write at the first call, then at most one per interval, plus one at the end.
    assert updates <= seconds / 0.05 + 2, job.result
    assert updates < 1000
    assert job.progress["done"] == 100_000
    assert job.progress["total"] == 100_000
    assert job.progress["note"] == "storm"


def test_a_failed_attempt_resumes_from_its_last_checkpoint():
    job = ManualCheckpoint.dispatch(50, fail_at=30)
    run_worker("long", concurrency=1)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert job.attempts == 2
    # The failed attempt's checkpoint was written when it ended: row 30, not earlier.
    assert job.result == 30
    assert job.checkpoint_data == {"row": 50, "password": "s3cret"}
    assert job.progress["done"] == 50


def test_an_atomic_jobs_checkpoint_rolls_back_with_it_and_commits_with_its_success():
    job = AtomicCheckpoint.dispatch()
    run_worker("long", concurrency=1)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert job.result is None  # the first attempt's checkpoint rolled back
    assert job.checkpoint_data == {"attempt": 2}


def test_gator_status_shows_the_progress_of_running_jobs(capsys):
    job = ManualCheckpoint.dispatch(1, fail_at=5)
    Job.objects.filter(pk=job.pk).update(
        state=JobState.RUNNING,
        reserved_by="w-x",
        locked_at=job.created_at,
        progress={"done": 250, "total": 1000, "note": "importing", "rate": 50.0},
    )
    call_command("gator_status")
    out = capsys.readouterr().out
    assert "Progress of running jobs" in out
    assert "250 / 1,000 (25 %)" in out
    assert "importing" in out
    call_command("gator_status", "--json")
    document = json.loads(capsys.readouterr().out)
    assert document["progress"][0]["id"] == job.pk
    assert document["progress"][0]["progress"]["done"] == 250


def test_progress_is_counted_in_the_metrics():
    from prometheus_client import REGISTRY

    from django_gator import metrics

    def counted() -> float:
        labels = {"job": ManualCheckpoint.name, "queue": "long"}
        return REGISTRY.get_sample_value("gator_job_progress_items_total", labels) or 0.0

    metrics.enable()
    try:
        before = counted()
        ManualCheckpoint.dispatch(50, fail_at=30)
        run_worker("long", concurrency=1)
        # Counted from each attempt's first report: 1 to 30, then 31 to 50.
        assert counted() - before == 29 + 19
    finally:
        metrics.disable()
