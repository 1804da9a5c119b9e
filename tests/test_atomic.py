"""Atomic jobs: handle() and the success mark commit in one transaction, so effects in the
jobs database apply exactly once, even when the worker is SIGKILLed mid-way."""

from __future__ import annotations

import signal

import pytest

from django_gator.models import Job, JobState
from tests.conftest import run_worker, wait_for, worker_output
from tests.testapp.jobs import AtomicBoom, AtomicRecord, NotAtomicBoom
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_atomic_job_commits_its_effects_with_its_success():
    job = AtomicRecord.dispatch("once")
    run_worker()

    job.refresh_from_db()
    assert (job.state, job.result, job.attempts) == (JobState.SUCCEEDED, "once", 1)
    assert list(Execution.objects.values_list("job_id", "label")) == [(job.pk, "once")]


def test_a_failing_atomic_job_leaves_no_effect_behind():
    atomic = AtomicBoom.dispatch("rolled back")
    plain = NotAtomicBoom.dispatch("kept")
    run_worker()

    for job in (atomic, plain):
        assert job.refresh_state() == JobState.DEAD
    atomic.refresh_from_db()
    assert atomic.last_error == "RuntimeError: rolled back"
    # The plain job's write stays; the atomic job's write went with its transaction.
    assert list(Execution.objects.values_list("label", flat=True)) == ["kept"]


def test_a_sigkill_before_the_success_mark_undoes_the_effects_and_the_retry_applies_once(
    spawn_worker, tmp_path
):
    flag = tmp_path / "written"
    job = AtomicRecord.dispatch("exactly-once", flag_file=str(flag), hold=60)
    first = spawn_worker("--concurrency", "2")
    wait_for(flag.exists, timeout=20)

    # The row is written, inside the job's transaction, which has not committed.
    assert not Execution.objects.exists()
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    assert not Execution.objects.exists()
    assert job.refresh_state() == JobState.RUNNING

    second = spawn_worker("--concurrency", "2")
    wait_for(lambda: job.refresh_state() == JobState.SUCCEEDED, timeout=30)

    job.refresh_from_db()
    assert job.attempts == 2  # the rescue charged the lost attempt
    assert job.rescues == 1
    assert job.errors[0]["class"] == "django_gator.exceptions.WorkerLost"
    assert list(Execution.objects.values_list("job_id", "attempt", "label")) == [
        (job.pk, 2, "exactly-once")
    ]
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=30) == 0, worker_output(second)


def test_atomic_must_be_a_bool():
    from django_gator import Queueable

    with pytest.raises(TypeError, match="atomic must be True or False, got 'yes'"):

        class Bad(Queueable):
            name = "tests.BadAtomic"
            atomic = "yes"  # type: ignore[assignment]

            def handle(self) -> None:
                return None

    assert not Job.objects.exists()
