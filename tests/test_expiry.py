"""Expiry: a job not started by its ``expires_at`` never runs. Every claim statement checks
it (the plain claim, the keyset claim, the flow-limited claim, the claim by id); the
worker's expiry sweep ends such jobs ``cancelled`` with the reason."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_gator import Batch, Queueable, Workflow, conf
from django_gator.dbtime import DbNow
from django_gator.engines import get_engine
from django_gator.expiry import EXPIRED_CLASS, EXPIRED_REASON, settle_expired
from django_gator.models import Job, JobState, WorkflowStep
from django_gator.states import StepState
from django_gator.testing import run_jobs
from django_gator.worker.lifeline import Lifeline
from tests.conftest import run_worker
from tests.testapp.jobs import BatchCompleted, BatchSucceeded, Record
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


class SendCode(Queueable):
    """A one-time code: worthless ten minutes after it was asked for."""

    queue = "expiry"
    expires = timedelta(minutes=10)

    def handle(self, user_id: int) -> None:
        Execution.objects.create(job_id=self.job_id, attempt=self.attempt, pid=0, label="code")


class LimitedCode(SendCode):
    queue = "expiry-limited"
    concurrency_limit = 1


def _expire(*jobs: Job) -> None:
    """Move the jobs' expiry into the past, as the clock would."""
    Job.objects.filter(pk__in=[job.pk for job in jobs]).update(
        expires_at=DbNow() - timedelta(seconds=1)
    )


def _expired(job: Job) -> bool:
    job.refresh_from_db()
    return (job.state, job.error_class, job.last_error) == (
        JobState.CANCELLED,
        EXPIRED_CLASS,
        EXPIRED_REASON,
    )


def test_the_class_expiry_is_counted_from_the_dispatch_by_database_time():
    before = get_engine(conf.database()).db_now()
    job = SendCode.dispatch(1)
    after = get_engine(conf.database()).db_now()
    assert job.expires_at is not None
    assert before + timedelta(minutes=10) <= job.expires_at <= after + timedelta(minutes=10)
    assert Job.objects.get(pk=job.pk).expires_at == job.expires_at


def test_expires_at_at_dispatch_wins_over_the_class():
    deadline = timezone.now() + timedelta(minutes=2)
    job = SendCode.dispatch(1, expires_at=deadline)
    plain = Record.dispatch("x", expires_at=deadline)
    many = Record.dispatch_many([["a"], ["b"]], expires_at=deadline)
    for row in [job, plain, *many]:
        assert row.expires_at == deadline
        assert Job.objects.get(pk=row.pk).expires_at == deadline
    assert Record.dispatch("y").expires_at is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"expires_at": "tomorrow"}, r"expires_at= must be a datetime, got 'tomorrow'"),
        ({"expires_at": timezone.now().replace(tzinfo=None)}, r"must be timezone-aware"),
        (
            {"expires_at": timezone.now() + timedelta(hours=1), "wait": timedelta(hours=2)},
            r"is not after the job's start.*could never run",
        ),
    ],
)
def test_bad_expiries_are_refused_at_dispatch(options, message):
    with pytest.raises(ValueError, match=message):
        Record.dispatch("x", **options)
    assert not Job.objects.exists()


def test_no_claim_takes_an_expired_job_even_before_the_sweep():
    expired, live = SendCode.dispatch(1), SendCode.dispatch(2)
    _expire(expired)
    engine = get_engine(conf.database())
    claimed = engine.claim("test-worker", "expiry", 10)
    assert [job.id for job in claimed] == [live.pk]
    assert engine.claim_by_id("test-worker", expired.pk) is None
    assert Job.objects.get(pk=expired.pk).state == JobState.WAITING  # not settled yet

    assert settle_expired(conf.database()) == 1
    assert _expired(expired)
    assert settle_expired(conf.database()) == 0


def test_the_flow_limited_claim_skips_expired_jobs():
    expired, live = LimitedCode.dispatch(1), LimitedCode.dispatch(2)
    _expire(expired)
    run_worker("expiry-limited")
    assert list(Execution.objects.values_list("job_id", flat=True)) == [live.pk]
    assert _expired(expired)


def test_a_worker_started_after_the_expiry_finds_it_expired():
    deadline = get_engine(conf.database()).db_now() + timedelta(seconds=1)
    job = Record.dispatch("late", expires_at=deadline)
    time.sleep(1.2)  # deliberate: the deadline passes in real time before any worker runs
    run_worker()
    assert not Execution.objects.exists()
    assert _expired(job)


@pytest.mark.skipif(connection.vendor == "sqlite", reason="no row locks to skip")
def test_a_stopping_worker_sweeps_again_what_a_lock_hid_from_its_first_sweep():
    """The start-up sweep skips a row another transaction holds (SKIP LOCKED; a claim
    walking past an expired row locks it for an instant). A worker that stops right after
    (a --burst worker with nothing to do) sweeps once more as it stops: the job does not
    stay waiting until some other worker's beat."""
    job = SendCode.dispatch(6)
    _expire(job)
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:  # a second connection holding the row's lock
        try:
            with transaction.atomic():
                Job.objects.select_for_update().filter(pk=job.pk).exists()
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert locked.wait(30)

    def stopped(interval: float) -> bool:  # after the start-up sweep: the lock goes
        assert Job.objects.get(pk=job.pk).state == JobState.WAITING  # skipped, not settled
        release.set()
        holder.join(30)
        return True

    Lifeline(get_engine("default"), "w-expiry").run(stopped)
    assert _expired(job)


def test_a_failed_job_whose_retry_comes_after_the_deadline_expires_too():
    job = SendCode.dispatch(3)
    Job.objects.filter(pk=job.pk).update(state=JobState.FAILED, attempts=1)
    _expire(job)
    run_worker("expiry")
    assert not Execution.objects.exists()
    assert _expired(job)


def test_run_jobs_leaves_jobs_expired_by_its_clock():
    job = SendCode.dispatch(4)
    assert run_jobs(advance=timedelta(minutes=11)) == []
    assert Job.objects.get(pk=job.pk).state == JobState.WAITING
    assert [row.pk for row in run_jobs()] == [job.pk]


def test_an_expired_member_completes_its_batch_as_a_cancelled_one():
    with Batch(on_success=BatchSucceeded, on_complete=BatchCompleted) as batch:
        ran = Record.dispatch("member")
        expiring = SendCode.dispatch(5)
    _expire(expiring)
    # Settled here, not by the worker's start-up sweep: that sweep's transaction (which
    # settles the batch) can hold the other member's row while the burst worker's first
    # claim skips it as locked, and a burst worker that found nothing exits (a race of
    # --burst seen once on CI's MariaDB line; the worker's own sweep is tested above).
    assert settle_expired(conf.database()) == 1
    run_worker()
    assert _expired(expiring)
    assert Job.objects.get(pk=ran.pk).state == JobState.SUCCEEDED
    assert Batch.objects.get(pk=batch.pk).is_complete
    callbacks = set(Job.objects.filter(batch_id=None).values_list("name", flat=True))
    assert BatchCompleted.name in callbacks
    assert BatchSucceeded.name not in callbacks  # not every member succeeded


class AddsACode(Queueable):
    """A member of a workflow's batch step that adds an expiring member while it runs."""

    queue = "expiry-adders"

    def handle(self) -> None:
        batch = self.batch()
        assert batch is not None, "runs as a member of a batch"
        batch.add(SendCode, 7)


def test_an_expired_member_cancels_its_workflow_batch_step_and_the_dependents():
    wf = Workflow(name="codes")
    codes = wf.add_batch(AddsACode, [[]])
    wf.add(Record, "after the codes", after=[codes])
    wf.dispatch()
    run_jobs()  # the code is sent in time: the workflow goes on
    assert Job.objects.get(name=SendCode.name).state == JobState.SUCCEEDED
    assert Execution.objects.filter(label="after the codes").count() == 1

    wf = Workflow(name="late codes")
    codes = wf.add_batch(AddsACode, [[]])
    after = wf.add(Record, "after the late codes", after=[codes])
    run = wf.dispatch()
    assert len(run_jobs(queue="expiry-adders")) == 1
    [code] = Job.objects.filter(name=SendCode.name, state=JobState.WAITING)
    _expire(code)
    assert settle_expired(conf.database()) == 1
    assert _expired(code)
    steps = {step.position: step for step in WorkflowStep.objects.filter(workflow=run)}
    assert steps[0].state == StepState.CANCELLED
    assert steps[1].state == StepState.CANCELLED
    run_jobs()
    assert after.job is None
    assert not Execution.objects.filter(label="after the late codes").exists()


def test_the_async_dispatches_take_an_expiry_too():
    from asgiref.sync import async_to_sync

    deadline = timezone.now() + timedelta(minutes=3)
    one = async_to_sync(Record.adispatch)("a", expires_at=deadline)
    many = async_to_sync(Record.adispatch_many)([["b"], ["c"]], expires_at=deadline)
    rows = Job.objects.filter(pk__in=[one.pk, *(job.pk for job in many)])
    assert [row.expires_at for row in rows] == [deadline] * 3
