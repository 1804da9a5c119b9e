"""A burst worker exits only when nothing due is left: not when its claim skipped a due
job because another transaction held the row's lock at that moment."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction

from django_gator.models import Job, JobState
from django_gator.worker.queues import parse_queue_specs
from django_gator.worker.supervisor import WorkerProcess
from tests.conftest import start_worker_thread
from tests.testapp.jobs import Echo

pytestmark = pytest.mark.django_db(transaction=True)

HOLD = 1.5  # seconds the other transaction keeps the row locked


def test_a_burst_worker_waits_for_a_due_job_another_transaction_holds():
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no row locks: a claim waits for the writer instead")
    job = Echo.dispatch(1)
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Job.objects.select_for_update().get(pk=job.pk)
                locked.set()
                release.wait(HOLD)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert locked.wait(10)
    worker = WorkerProcess(
        parse_queue_specs([job.queue]), concurrency=1, burst=True, install_signal_handlers=False
    )
    thread = start_worker_thread(worker)
    thread.join(HOLD / 2)
    # Before the fix the burst worker had exited by now, leaving the job waiting.
    assert thread.is_alive(), "the burst worker exited while a due job was only locked"
    release.set()
    holder.join(10)
    thread.join(30)
    assert not thread.is_alive(), "the burst worker did not end after the lock was released"
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED


def test_a_burst_worker_does_not_wait_for_jobs_it_cannot_take():
    """Jobs not yet due, of a paused queue, or past their expiry are not waited for."""
    from datetime import timedelta

    from django.utils import timezone

    from django_gator.models import Queue

    Echo.dispatch(1, at=timezone.now() + timedelta(hours=1))
    expired = Echo.dispatch(2, expires_at=timezone.now() + timedelta(seconds=1))
    Job.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=5))
    Queue.objects.create(name="paused-q", paused=True)
    Echo.dispatch(3, queue="paused-q")
    worker = WorkerProcess(
        parse_queue_specs([Echo.queue, "paused-q"]),
        concurrency=1,
        burst=True,
        install_signal_handlers=False,
    )
    thread = start_worker_thread(worker)
    thread.join(30)
    assert not thread.is_alive(), "the burst worker waited for jobs it may not take"
