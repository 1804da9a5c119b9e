"""Awaitable results (issue 34, item 4): ``job.wait_result()`` / ``await_result()`` and
``run.wait_result()`` against real worker processes: the return value, the final error
of a dead or cancelled job, a timeout naming what it waited for, a retried attempt that
is not an end, a workflow's leaf results and its first failed step. On PostgreSQL: the
waiter woken by the NOTIFY of its job's or workflow's end (with the fallback read pushed
out of reach), an end committed while the flag waited for the row's lock, a lost LISTEN
connection reopened, and no NOTIFY for jobs nobody waits for."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, connections, transaction
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

from django_gator import Workflow, endwatch
from django_gator.engines.ends import ENDS_CHANNEL
from django_gator.exceptions import GatorError, JobFailed, ResultTimeout, WorkflowFailed
from django_gator.models import Job, JobState, WorkflowRun, WorkflowStep, awaiting
from django_gator.states import FINAL_STATES
from tests.conftest import wait_for, waiting_on_locks
from tests.testapp.jobs import Boom, Echo, Gathers, Produces, Record, RecordFailsFirst

pytestmark = pytest.mark.django_db(transaction=True)

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="needs PostgreSQL (LISTEN/NOTIFY)"
)


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


def test_a_job_that_ended_before_the_wait_is_returned_by_the_first_read():
    """With ``timeout=0`` a wait that had to pause would raise: these return at once (on
    PostgreSQL the flag's UPDATE ... RETURNING is that read)."""
    done = Record.dispatch("done", wait=timedelta(hours=1))
    Job.objects.filter(pk=done.pk).update(
        state=JobState.SUCCEEDED, result={"ended": "before"}, finished_at=Now()
    )
    assert done.wait_result(timeout=0) == {"ended": "before"}
    cancelled = Record.dispatch("cancelled", wait=timedelta(hours=1))
    assert cancelled.cancel()
    with pytest.raises(JobFailed, match="ended cancelled"):
        cancelled.wait_result(timeout=0)
    assert async_to_sync(done.await_result)(timeout=0) == {"ended": "before"}


def _listening() -> endwatch.EndWatch:
    """This process's watch of the test database, its LISTEN connection up."""
    watch = endwatch.watch("default")
    assert watch is not None

    def hold() -> None:
        """Keeps the listener open while the test sets up (nothing to wake)."""

    watch.subscribe("test", hold)
    wait_for(watch.listening.is_set)
    return watch


def _waiting(wait: object, outcome: dict[str, object]) -> threading.Thread:
    """A thread that calls ``wait()`` and keeps its return value or error, and the SQL it
    sent."""

    def run() -> None:
        try:
            with CaptureQueriesContext(connections["default"]) as captured:
                try:
                    outcome["value"] = wait()  # type: ignore[operator]
                except Exception as exc:
                    outcome["error"] = exc
            outcome["sql"] = [query["sql"] for query in captured.captured_queries]
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@postgres_only
def test_on_postgresql_the_waiter_is_woken_by_the_notify_of_its_jobs_end(spawn_worker, monkeypatch):
    """No fallback read comes before the 120 s timeout: only the NOTIFY can end this
    wait. It reads the state twice: the flag's UPDATE at the start, one SELECT after the
    notification (then the result, once)."""
    monkeypatch.setattr(awaiting, "FALLBACK_PAUSE", 600.0)
    watch = _listening()
    opened = watch.connections
    job = Record.dispatch("woken", wait=timedelta(hours=1))
    spawn_worker("--concurrency", "1")
    outcome: dict[str, object] = {}
    waiter = _waiting(lambda: job.wait_result(timeout=120), outcome)
    wait_for(lambda: Job.objects.filter(pk=job.pk, awaited=True).exists())
    Job.objects.filter(pk=job.pk).update(next_execution_at=Now())  # due: the worker runs it
    waiter.join(timeout=150)

    assert outcome.get("value") == {"label": "woken", "attempt": 1}, outcome.get("error")
    sql = outcome["sql"]
    assert len([q for q in sql if "SET awaited = true" in q]) == 1
    state_reads = [
        q for q in sql if q.startswith('SELECT "django_gator_job"."state" AS "state" FROM')
    ]
    assert len(state_reads) == 1, sql
    assert watch.connections == opened  # one connection served it all


@postgres_only
def test_on_postgresql_a_workflows_waiter_is_woken_when_its_last_step_settles(
    spawn_worker, monkeypatch
):
    monkeypatch.setattr(awaiting, "FALLBACK_PAUSE", 600.0)
    _listening()
    wf = Workflow(name="gate")
    wf.add(Produces, "first", name="first")
    wf.add_wait("go", timeout=timedelta(hours=1), name="gate")
    run = wf.dispatch()
    spawn_worker("--concurrency", "1")
    outcome: dict[str, object] = {}
    waiter = _waiting(lambda: run.wait_result(timeout=120), outcome)
    wait_for(lambda: WorkflowStep.objects.filter(workflow=run, awaited=True).exists())
    run.signal("go", {"by": "ana"})
    waiter.join(timeout=150)

    assert outcome.get("value") == {"first": "first", "gate": {"by": "ana"}}, outcome
    assert not WorkflowStep.objects.filter(workflow=run, state__in=awaiting.OPEN).exists()


@postgres_only
def test_on_postgresql_a_lost_listen_connection_is_reopened_and_the_waiter_still_woken(
    monkeypatch,
):
    monkeypatch.setattr(awaiting, "FALLBACK_PAUSE", 600.0)
    watch = _listening()
    opened = watch.connections
    job = Record.dispatch("lost", wait=timedelta(hours=1))
    outcome: dict[str, object] = {}
    waiter = _waiting(lambda: job.wait_result(timeout=120), outcome)
    wait_for(lambda: Job.objects.filter(pk=job.pk, awaited=True).exists())
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query = %s",
            [f"LISTEN {ENDS_CHANNEL}"],
        )
        assert cursor.fetchone() == (True,)
    wait_for(lambda: watch.connections == opened + 1 and watch.listening.is_set())
    assert waiter.is_alive()
    assert job.cancel()
    waiter.join(timeout=150)

    error = outcome.get("error")
    assert isinstance(error, JobFailed), outcome
    assert error.state == JobState.CANCELLED


@postgres_only
def test_on_postgresql_jobs_nobody_waits_for_end_without_a_notify(spawn_worker):
    raw = connection.get_new_connection(connection.get_connection_params())
    try:
        raw.autocommit = True
        raw.execute(f"LISTEN {ENDS_CHANNEL}")
        jobs = [Echo.dispatch(i) for i in range(5)] + [Boom.dispatch("unawaited")]
        cancelled = Record.dispatch("cancelled", wait=timedelta(hours=1))
        assert cancelled.cancel()
        spawn_worker("--concurrency", "2")
        ids = [job.pk for job in jobs]
        wait_for(lambda: Job.objects.filter(pk__in=ids, state__in=FINAL_STATES).count() == 6)
        assert Job.objects.get(pk=jobs[-1].pk).state == JobState.DEAD
        # Every end has committed, so its NOTIFY (if any) is already here.
        assert [n.payload for n in raw.notifies(timeout=0.2)] == []  # deliberate: none come
        assert not Job.objects.filter(awaited__isnull=False).exists()
    finally:
        raw.close()


@postgres_only
def test_on_postgresql_an_end_committing_while_the_flag_waits_for_its_lock_is_returned(
    monkeypatch,
):
    """The end's UPDATE holds the row's lock, uncommitted, when the waiter flags: the
    flag waits for that lock, then returns the end itself (the end's trigger saw no flag,
    so no NOTIFY comes; a fallback read would take 600 s)."""
    monkeypatch.setattr(awaiting, "FALLBACK_PAUSE", 600.0)
    _listening()
    job = Record.dispatch("raced", wait=timedelta(hours=1))
    other = connection.get_new_connection(connection.get_connection_params())
    try:
        other.execute(
            "UPDATE django_gator_job SET state = %s, result = %s::jsonb WHERE id = %s",
            [JobState.SUCCEEDED.value, '{"ended": "first"}', job.pk],
        )  # psycopg opens a transaction: not committed yet
        outcome: dict[str, object] = {}
        waiter = _waiting(lambda: job.wait_result(timeout=120), outcome)
        wait_for(lambda: waiting_on_locks() == 1, interval=0.2)
        other.commit()
        waiter.join(timeout=150)
    finally:
        other.close()
    assert outcome.get("value") == {"ended": "first"}, outcome
    state_reads = 'SELECT "django_gator_job"."state" AS "state" FROM'
    assert not [q for q in outcome["sql"] if q.startswith(state_reads)]  # the flag said it
