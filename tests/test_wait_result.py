"""Awaitable results (issue 34, item 4): ``job.wait_result()`` / ``await_result()`` and
``run.wait_result()`` against real worker processes: the return value, the final error
of a dead or cancelled job, a timeout naming what it waited for, a retried attempt that
is not an end, a workflow's leaf results and its first failed step."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import connections, transaction

from django_gator import Workflow
from django_gator.exceptions import GatorError, JobFailed, ResultTimeout, WorkflowFailed
from django_gator.models import Job, JobState, WorkflowRun
from tests.testapp.jobs import Boom, Echo, Gathers, Produces, Record, RecordFailsFirst

pytestmark = pytest.mark.django_db(transaction=True)


def test_wait_result_returns_what_handle_returned_once_a_worker_has_run_it(spawn_worker):
    job = Echo.dispatch(1, "two", three=3)
    spawn_worker("--concurrency", "2")

    assert job.wait_result(timeout=60) == {
        "args": [1, "two"],
        "kwargs": {"three": 3},
        "queue": "echo",
    }
    assert job.state == JobState.SUCCEEDED
    slow = Record.dispatch("slow", sleep=0.3)  # the wait reads it several times first
    assert slow.wait_result(timeout=timedelta(seconds=60)) == {"label": "slow", "attempt": 1}


def test_a_failed_attempt_that_will_be_retried_is_not_an_end(spawn_worker):
    job = RecordFailsFirst.dispatch("twice")
    spawn_worker("--concurrency", "1")

    assert job.wait_result(timeout=60) is None
    job.refresh_from_db()
    assert (job.state, job.attempts) == (JobState.SUCCEEDED, 2)


def test_wait_result_raises_the_final_error_of_a_dead_job(spawn_worker):
    job = Boom.dispatch("the disk is full")
    spawn_worker("--concurrency", "1")

    with pytest.raises(JobFailed, match=rf"job {Boom.name} #{job.pk} ended dead") as caught:
        job.wait_result(timeout=60)
    error = caught.value
    assert (error.job_id, error.state, error.error_class) == (job.pk, "dead", "RuntimeError")
    assert "the disk is full" in str(error)
    assert "the disk is full" in error.error
    assert error.name == Boom.name


def test_a_cancelled_job_raises_and_a_job_not_ended_times_out_naming_it():
    later = Record.dispatch("later", wait=timedelta(hours=1))
    with pytest.raises(ResultTimeout, match=rf"job {Record.name} #{later.pk} had not ended"):
        later.wait_result(timeout=0.2)
    with pytest.raises(TimeoutError):  # a ResultTimeout is a TimeoutError
        later.wait_result(timeout=0)

    assert later.cancel()
    with pytest.raises(JobFailed, match="ended cancelled") as caught:
        later.wait_result(timeout=5)
    assert caught.value.state == JobState.CANCELLED


def test_bad_timeouts_unsaved_jobs_and_waits_inside_a_transaction_are_refused():
    job = Record.dispatch("x", wait=timedelta(hours=1))
    with pytest.raises(TypeError, match=r"timeout must be seconds .* got '30'"):
        job.wait_result(timeout="30")
    with pytest.raises(ValueError, match="timeout must be 0 or more seconds, got -1"):
        job.wait_result(timeout=-1)
    with pytest.raises(ValueError, match="has no id"):
        Job(name=Record.name).wait_result(timeout=1)
    with pytest.raises(Job.DoesNotExist, match=rf"#{job.pk + 1000} is not in the database"):
        Job(pk=job.pk + 1000, name="x").wait_result(1)

    with transaction.atomic(), pytest.raises(GatorError, match=r"inside transaction.atomic\(\)"):
        Record.dispatch("in the transaction").wait_result(timeout=30)
    job.cancel()
    with transaction.atomic(), pytest.raises(JobFailed):
        job.wait_result(timeout=1)  # ended already: no wait, so no refusal


def test_await_result_waits_on_the_event_loop(spawn_worker):
    job = Record.dispatch("async", sleep=0.2)
    dead = Boom.dispatch("async boom")
    spawn_worker("--concurrency", "2")

    async def both() -> tuple[object, BaseException]:
        result = await job.await_result(timeout=60)
        try:
            await dead.await_result(timeout=60)
        except JobFailed as exc:
            return result, exc
        raise AssertionError("a dead job's await_result returned")

    result, error = async_to_sync(both)()
    assert result == {"label": "async", "attempt": 1}
    assert isinstance(error, JobFailed)
    assert error.error_class == "RuntimeError"
    later = Record.dispatch("later", wait=timedelta(hours=1))
    with pytest.raises(ResultTimeout):
        async_to_sync(later.await_result)(timeout=0.1)


def _order() -> WorkflowRun:
    wf = Workflow(name="order 42")
    a = wf.add(Produces, "a", name="fetch_a")
    b = wf.add(Produces, "b", name="fetch_b")
    merge = wf.add(Gathers, "merge", after=[a, b], name="merge")
    wf.add(Produces, "side", after=[a], name="side")
    wf.add_wait("approved", after=[merge], timeout=timedelta(days=3), name="approval")
    wf.add_batch(Produces, [[1], [2], [3]], after=["approval"], name="ship")
    return wf.dispatch()


def test_a_workflows_wait_result_gives_its_leaves_results_once_a_signal_released_it(
    spawn_worker,
):
    run = _order()
    spawn_worker("--concurrency", "2")
    with pytest.raises(ResultTimeout, match=rf"workflow {run.pk} \(order 42\) had not ended"):
        run.wait_result(timeout=1)  # the approval waits for its signal

    def approve() -> None:
        try:
            WorkflowRun.objects.get(pk=run.pk).signal("approved", {"by": "ana"})
        finally:
            connections.close_all()

    signaller = threading.Thread(target=approve)
    signaller.start()  # while the wait below is under way
    results = run.wait_result(timeout=60)
    signaller.join()

    assert results == {"side": "side", "ship": [1, 2, 3]}
    assert async_to_sync(run.await_result)(timeout=5) == results


def test_a_workflows_wait_result_raises_for_its_first_dead_step(spawn_worker):
    wf = Workflow(name="doomed")
    first = wf.add(Produces, 1, name="first")
    boom = wf.add(Boom, "step two broke", after=[first], name="boom")
    wf.add(Produces, 3, after=[boom], name="after_boom")
    wf.add(Produces, 4, after=[first], name="other")
    run = wf.dispatch()
    spawn_worker("--concurrency", "2")

    with pytest.raises(WorkflowFailed, match=r"step 'boom' ended dead: .*step two broke") as caught:
        run.wait_result(timeout=60)
    error = caught.value
    assert (error.workflow, error.step, error.state) == (str(run.pk), "boom", "dead")
    assert isinstance(error.error, JobFailed)
    assert error.error.error_class == "RuntimeError"
    assert Job.objects.get(pk=error.error.job_id).state == JobState.DEAD

    cancelled = Workflow(name="stopped")
    cancelled.add_wait("never", timeout=timedelta(hours=1), name="only")
    stopped = cancelled.dispatch()
    stopped.cancel(by="ops")
    with pytest.raises(WorkflowFailed, match="step 'only' ended cancelled"):
        stopped.wait_result(timeout=5)


@pytest.mark.django_db(transaction=False)
def test_under_gator_immediate_the_result_is_there_at_once_even_in_a_testcase(settings):
    """A TestCase's transaction is open, but the job ran at dispatch: no wait, no refusal."""
    settings.GATOR_IMMEDIATE = True
    assert connections["default"].in_atomic_block
    assert Echo.dispatch(5).wait_result(timeout=0) == {"args": [5], "kwargs": {}, "queue": "echo"}
    assert async_to_sync(Echo.dispatch(6).await_result)(timeout=0)["args"] == [6]
