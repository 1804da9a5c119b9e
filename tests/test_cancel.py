"""Cancellation: a waiting job never runs; a running one is asked to stop and checks
``self.cancel_requested()``; ``cancelled`` is final."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest
from django.utils import timezone

from django_gator.models import Job, JobState, Worker
from tests.conftest import run_worker, wait_for, worker_output
from tests.testapp.jobs import BoomWithRetry, Cancellable, FailsAfterCancel, Noop
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_cancelled_waiting_job_never_runs():
    job = Cancellable.dispatch(0)
    assert job.cancel() is True
    assert job.state == JobState.CANCELLED
    assert job.finished_at is not None

    run_worker()
    assert not Execution.objects.exists()
    assert job.refresh_state() == JobState.CANCELLED


def test_a_job_waiting_for_its_retry_can_be_cancelled():
    job = BoomWithRetry.dispatch()
    run_worker()
    assert job.refresh_state() == JobState.FAILED
    assert job.cancel() is True
    assert job.state == JobState.CANCELLED
    Job.objects.filter(pk=job.pk).update(next_execution_at=timezone.now())
    run_worker()
    assert job.refresh_state() == JobState.CANCELLED


def test_finished_jobs_are_left_alone():
    job = Noop.dispatch()
    run_worker()
    assert job.cancel() is False
    assert job.refresh_state() == JobState.SUCCEEDED
    assert Job.objects.cancel() == 0


def test_a_running_job_stops_when_asked(spawn_worker):
    job = Cancellable.dispatch(30)
    proc = spawn_worker("--concurrency", "2")
    wait_for(lambda: Execution.objects.filter(job_id=job.pk, label="started").exists())

    assert Job.objects.filter(pk=job.pk).cancel() == 1
    job.refresh_from_db()
    # A request, not a cancellation: the row stays running until the job sees it (it looks
    # every 10 ms, so under load it may have stopped already by this read).
    assert job.cancel_requested
    assert job.state in (JobState.RUNNING, JobState.CANCELLED)

    wait_for(lambda: job.refresh_state() == JobState.CANCELLED, timeout=10)
    job.refresh_from_db()
    assert job.finished_at is not None
    assert (
        job.last_error == f"django_gator.exceptions.JobCancelled: job {job.pk} stopped on request"
    )
    assert job.attempts == 1

    follower = Noop.dispatch()  # the worker is still fine
    wait_for(lambda: follower.refresh_state() == JobState.SUCCEEDED)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, worker_output(proc)


def test_a_job_that_fails_after_a_cancel_request_is_not_retried(spawn_worker, tmp_path):
    flag = tmp_path / "running"
    job = FailsAfterCancel.dispatch(str(flag))
    proc = spawn_worker()
    wait_for(flag.exists)
    job.cancel()

    wait_for(lambda: job.refresh_state() == JobState.CANCELLED, timeout=10)
    job.refresh_from_db()
    assert job.attempts == 1
    assert job.last_error == "RuntimeError: failed after the cancel request"
    assert len(job.errors) == 1
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, worker_output(proc)


def test_a_job_that_finishes_despite_the_request_succeeds():
    job = Noop.dispatch()
    # As if the request came in while it ran (Noop never looks at it).
    Job.objects.filter(pk=job.pk).update(cancel_requested=True)
    run_worker()
    assert job.refresh_state() == JobState.SUCCEEDED


def test_a_rescued_job_with_a_cancel_request_ends_cancelled():
    stale = timezone.now() - timedelta(minutes=10)
    Worker.objects.create(id="gone:1:x", hostname="gone", pid=1, concurrency=1, heartbeat_at=stale)
    job = Cancellable.dispatch(30)
    Job.objects.filter(pk=job.pk).update(
        state=JobState.RUNNING,
        reserved_by="gone:1:x",
        locked_at=stale,
        attempts=1,
        cancel_requested=True,
    )
    run_worker()  # rescues at start-up

    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert job.rescues == 1
    assert not Execution.objects.exists()
