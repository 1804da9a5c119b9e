"""Long-running jobs (issue 35): stall detection on a healthy worker, each() resuming at
its cursor, in sync and async handlers."""

from __future__ import annotations

import time

import pytest
from django.test import override_settings

from django_gator.models import Job, JobState, Worker
from django_gator.worker.queues import parse_queue_specs
from django_gator.worker.supervisor import WorkerProcess
from tests.conftest import run_worker, start_worker_thread, wait_for
from tests.testapp.long_jobs import (
    AsyncCounts,
    AsyncSlowItems,
    AsyncStalls,
    CountsItems,
    CountsRows,
    Stalls,
)
from tests.testapp.models import ItemDone

pytestmark = pytest.mark.django_db(transaction=True)

STALLED = "django_gator.exceptions.JobStalled"


def test_a_stalled_job_is_failed_and_retried_while_its_worker_stays_healthy():
    job = Stalls.dispatch(quiet=30)
    started = time.monotonic()
    worker = run_worker("long", concurrency=2)
    took = time.monotonic() - started
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED, job.last_error
    assert job.result == 2
    assert [e["class"] for e in job.errors] == [STALLED]
    assert "stall_timeout" in job.errors[0]["message"]
    # Cut after about half a second of silence, not after its 30 s of quiet; the second
    # attempt, busy for a second with heartbeats, was not cut.
    assert took < 15
    # The worker went on: it ran the retry itself, and its thread was replaced.
    assert worker.slots.processed >= 1
    assert worker.executors.started >= 3


def test_a_stalled_async_job_is_cancelled_and_retried():
    job = AsyncStalls.dispatch()
    started = time.monotonic()
    run_worker("long", concurrency=1)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED, job.last_error
    assert job.result == 2
    assert [e["class"] for e in job.errors] == [STALLED]
    assert time.monotonic() - started < 15


@override_settings(GATOR_PROGRESS_INTERVAL=3600)
def test_each_resumes_after_an_error_at_the_item_that_failed():
    # With an hour between writes, only the write at the end of the failed attempt can
    # have saved its position.
    job = CountsItems.dispatch(40, fail_at=25)
    run_worker("long", concurrency=1)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED, job.last_error
    items = list(ItemDone.objects.filter(job_id=job.pk).values_list("item", "attempt"))
    assert sorted(i for i, _ in items) == list(range(40))  # none twice, none missed
    assert {i for i, a in items if a == 2} == set(range(25, 40))
    assert job.checkpoint_data == {"each": 40}
    assert job.progress["done"] == 40
    assert job.progress["total"] == 40


def test_each_walks_a_queryset_by_primary_key_and_resumes_after_the_last_row():
    source = CountsItems.dispatch(20)
    run_worker("long", concurrency=1)
    rows = list(ItemDone.objects.filter(job_id=source.pk).order_by("pk"))
    job = CountsRows.dispatch(source.pk)
    # As if an earlier attempt had done the first 12 rows.
    Job.objects.filter(pk=job.pk).update(checkpoint_data={"each": rows[11].pk})
    run_worker("long", concurrency=1)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED, job.last_error
    assert job.result == [r.item for r in rows[12:]]
    assert job.progress["done"] == 20
    assert job.progress["total"] == 20


def test_each_in_an_async_handler_resumes_at_its_cursor():
    job = AsyncCounts.dispatch(30, fail_at=12)
    run_worker("long", concurrency=1)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED, job.last_error
    assert job.result == list(range(12, 30))
    assert job.checkpoint_data == {"each": 30}


def test_workers_left_nothing_behind():
    assert not Worker.objects.exists()


def test_run_jobs_resumes_an_async_handlers_each_and_writes_its_progress():
    # run_jobs() awaits an async handler in its own event loop: the journal reads and
    # writes off that loop.
    from django_gator.testing import run_jobs

    job = AsyncCounts.dispatch(30, fail_at=12)
    run_jobs(raise_errors=False)
    run_jobs(raise_errors=False)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED, job.last_error
    assert job.result == list(range(12, 30))
    assert job.progress["done"] == 30


@override_settings(GATOR_PROGRESS_INTERVAL=0.1)
def test_an_async_job_in_each_is_handed_back_at_its_cursor_when_its_worker_stops():
    job = AsyncSlowItems.dispatch(500, 0.02)
    worker = WorkerProcess(
        parse_queue_specs(["long"]),
        concurrency=1,
        install_signal_handlers=False,
        shutdown_timeout=120,  # only the hand-back lets it stop at once
    )
    thread = start_worker_thread(worker)
    wait_for(lambda: (Job.objects.get(pk=job.pk).progress or {}).get("done", 0) >= 5)
    worker.request_stop()
    thread.join(30)
    assert not thread.is_alive()
    row = Job.objects.get(pk=job.pk)
    assert row.state == JobState.WAITING
    assert row.handbacks == 1
    saved = row.checkpoint_data["each"]
    assert 5 <= saved < 500
    run_worker("long", concurrency=1)
    row.refresh_from_db()
    assert row.state == JobState.SUCCEEDED
    assert row.result == saved
