"""The worker, run in this process in burst mode: what it runs, what it records."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from django_gator.models import Job, JobState
from tests.conftest import run_worker, start_worker_thread, wait_for
from tests.testapp.jobs import (
    Boom,
    BoomWithRetry,
    Echo,
    ExitsProcess,
    Record,
    RecordFailsFirst,
    ReturnsObject,
    add,
    record_kw,
)
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def test_runs_each_dispatched_job_exactly_once_and_records_results():
    plain = Echo.dispatch(1, "two", three=[3])
    overridden = Echo.dispatch("q", queue="other", priority=-5)
    past = Echo.dispatch("at", at=timezone.now() - timedelta(seconds=1))
    bulk = add.dispatch_many([[1, 2], {"a": 10, "b": 20}])
    kw = record_kw.dispatch(label="kw")
    recorded = Record.dispatch_many([["r1"], ["r2"], ["r3"]])

    worker = run_worker(concurrency=3)

    assert worker.processed == 9
    assert Job.objects.exclude(state=JobState.SUCCEEDED).count() == 0
    assert Job.objects.get(pk=plain.pk).result == {
        "args": [1, "two"],
        "kwargs": {"three": [3]},
        "queue": "echo",
    }
    assert Job.objects.get(pk=overridden.pk).result["queue"] == "other"
    assert Job.objects.get(pk=past.pk).result["args"] == ["at"]
    assert [Job.objects.get(pk=j.pk).result for j in bulk] == [3, 30]
    assert Execution.objects.filter(label="kw").count() == 1
    assert Job.objects.get(pk=kw.pk).attempts == 1
    ledger = sorted(Execution.objects.exclude(label="kw").values_list("job_id", "attempt"))
    assert ledger == sorted((j.pk, 1) for j in recorded)
    for job in Job.objects.all():
        assert job.started_at is not None
        assert job.finished_at is not None
        assert job.finished_at >= job.started_at
        assert job.reserved_by == worker.worker_id


def test_future_jobs_wait_for_their_time():
    later = Echo.dispatch("later", wait=timedelta(hours=1))
    at = Echo.dispatch("at", at=timezone.now() + timedelta(minutes=5))
    now = Echo.dispatch("now")

    run_worker()

    assert Job.objects.get(pk=now.pk).state == JobState.SUCCEEDED
    assert Job.objects.get(pk=later.pk).state == JobState.WAITING
    assert Job.objects.get(pk=at.pk).state == JobState.WAITING
    assert Job.objects.get(pk=later.pk).attempts == 0


def test_a_raising_job_without_retry_policy_goes_dead_with_its_traceback():
    job = Boom.dispatch("kaboom <b>")

    worker = run_worker()

    job.refresh_from_db()
    assert job.state == JobState.DEAD
    assert job.attempts == 1
    assert job.finished_at is not None
    assert job.last_error == "RuntimeError: kaboom <b>"
    assert job.args == ["kaboom <b>"]  # the payload is kept
    [entry] = job.errors
    assert entry["class"] == "RuntimeError"
    assert entry["message"] == "kaboom <b>"
    assert entry["attempt"] == 1
    assert entry["worker"] == worker.worker_id
    assert "raise RuntimeError(message)" in entry["traceback"]
    assert "tests/testapp/jobs.py" in entry["traceback"]


def test_a_retry_policy_schedules_the_next_attempt_on_its_queue():
    job = BoomWithRetry.dispatch()

    run_worker()

    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert job.queue == "retries"
    delay = (job.next_execution_at - job.locked_at).total_seconds()
    assert 59 <= delay <= 61
    assert [e["message"] for e in job.errors] == ["attempt 1 failed"]


def test_retries_run_until_the_policy_is_exhausted_keeping_every_error():
    job = BoomWithRetry.dispatch()
    for expected_state in (JobState.FAILED, JobState.FAILED, JobState.DEAD):
        Job.objects.filter(pk=job.pk).update(next_execution_at=timezone.now())
        run_worker()
        job.refresh_from_db()
        assert job.state == expected_state
    assert job.attempts == 3
    assert [e["message"] for e in job.errors] == [
        "attempt 1 failed",
        "attempt 2 failed",
        "attempt 3 failed",
    ]


def test_an_unknown_job_name_goes_dead_and_the_worker_goes_on():
    bad = Job.objects.create(name="os.system", args=["echo pwned"], kwargs={})
    good = Echo.dispatch("fine")

    run_worker()

    bad.refresh_from_db()
    assert bad.state == JobState.DEAD
    assert "job name 'os.system' is not registered" in bad.last_error
    assert bad.errors[0]["class"] == "django_gator.exceptions.JobNotRegistered"
    assert Job.objects.get(pk=good.pk).state == JobState.SUCCEEDED


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ({"not": "a list"}, {}, "args must be a JSON array"),
        ([], ["not", "an", "object"], "kwargs must be a JSON object"),
    ],
)
def test_a_row_with_undecodable_arguments_goes_dead(args, kwargs, message):
    bad = Job.objects.create(name=Echo.name, args=args, kwargs=kwargs)

    run_worker()

    bad.refresh_from_db()
    assert bad.state == JobState.DEAD
    assert message in bad.last_error


def test_sys_exit_in_a_job_fails_the_job_not_the_worker():
    job = ExitsProcess.dispatch()
    after = Echo.dispatch("after")

    run_worker(concurrency=1)

    job.refresh_from_db()
    assert job.state == JobState.DEAD
    assert job.last_error == "SystemExit: 3"
    assert Job.objects.get(pk=after.pk).state == JobState.SUCCEEDED


def test_a_non_json_return_value_fails_the_attempt_naming_it():
    """Not a NULL result that reads as a returned None: the attempt fails, as for a result
    over GATOR_MAX_RESULT_BYTES, and the error says what was returned."""
    job = ReturnsObject.dispatch()

    run_worker()

    job.refresh_from_db()
    assert job.state == JobState.DEAD  # ReturnsObject has no retry policy
    assert job.result is None
    assert job.error_class == "django_gator.exceptions.ResultNotJSON"
    assert job.last_error.startswith(
        f"django_gator.exceptions.ResultNotJSON: job {job.pk} ({ReturnsObject.name}) returned "
        "a value JSON cannot hold, so its result cannot be stored: "
    )
    assert "object" in job.last_error
    with pytest.raises(Exception, match="returned a value JSON cannot hold"):
        job.wait_result(timeout=1)


def test_higher_priority_runs_first_within_a_queue():
    low = Record.dispatch("low", priority=-10)
    mid = Record.dispatch_many([["mid1"], ["mid2"]])
    high = Record.dispatch("high", priority=50)

    run_worker(concurrency=1)

    order = list(Execution.objects.order_by("id").values_list("job_id", flat=True))
    assert order == [high.pk, mid[0].pk, mid[1].pk, low.pk]


def test_a_worker_only_takes_jobs_from_its_queues():
    mine = Echo.dispatch("mine", queue="mine")
    theirs = Echo.dispatch("theirs", queue="theirs")

    run_worker("mine,3", "spare")

    assert Job.objects.get(pk=mine.pk).state == JobState.SUCCEEDED
    assert Job.objects.get(pk=theirs.pk).state == JobState.WAITING


def test_a_job_past_its_timeout_fails_and_its_slot_is_freed():
    from tests.testapp.jobs import TooSlow, TooSlowWithRetry

    slow = TooSlow.dispatch(priority=10)
    retried = TooSlowWithRetry.dispatch(priority=5)
    after = Echo.dispatch("after", queue="default")

    started = time.monotonic()
    worker = run_worker("default", concurrency=1)

    assert time.monotonic() - started < 10
    slow.refresh_from_db()
    assert slow.state == JobState.DEAD
    assert slow.last_error == (
        "django_gator.exceptions.JobTimeout: job ran longer than its timeout of 0.5 s"
    )
    retried.refresh_from_db()
    assert retried.state == JobState.FAILED  # its retry policy applies to a timeout
    assert Job.objects.get(pk=after.pk).state == JobState.SUCCEEDED
    # The interrupted runs ended (their threads are gone) and never reached their last line.
    wait_for(lambda: not worker.threads.running() and not worker.slots.retired, timeout=10)
    assert not Execution.objects.filter(job_id__in=[slow.pk, retried.pk]).exists()


def test_a_worker_keeps_no_thread_that_a_timeout_replaced():
    """Every timeout gives the slot a fresh executor thread. The worker once kept each
    replaced thread (its list of threads and its set of retired executors only grew):
    about 3 KiB per timed-out job, which a 2-hour soak showed as RSS growing without end."""
    from tests.testapp.jobs import TooSlow

    TooSlow.dispatch_many([[30]] * 4)

    worker = run_worker("default", concurrency=1)

    assert Job.objects.filter(state=JobState.DEAD).count() == 4
    assert worker.executors.started == 5  # the first executor and one per timeout

    # The last replaced thread may still be on its way out.
    wait_for(lambda: not worker.threads.running() and not worker.slots.retired, timeout=10)


def test_a_thread_that_could_not_start_is_not_kept(monkeypatch):
    """A thread the system refused to start (too many threads) is not kept among the
    worker's threads (the shutdown would fail to join it), and the error reaches the
    caller, which may hold the slots' lock, without waiting for that lock."""
    import threading

    from django_gator.worker.queues import parse_queue_specs
    from django_gator.worker.supervisor import WorkerProcess

    worker = WorkerProcess(
        parse_queue_specs(["default"]), concurrency=1, burst=True, install_signal_handlers=False
    )

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    go = threading.Event()
    errors: list[BaseException] = []

    def watchdog() -> None:
        go.wait(10)
        with worker.slots.lock:  # a timed-out job's new executor starts under this lock
            try:
                worker.threads.spawn("gator-executor-9", lambda: None)
            except RuntimeError as exc:
                errors.append(exc)

    caller = threading.Thread(target=watchdog, daemon=True)
    caller.start()
    monkeypatch.setattr(threading.Thread, "start", refuse)
    go.set()
    caller.join(10)
    assert not caller.is_alive(), "spawn waited for the slots' lock its caller holds"
    assert [str(e) for e in errors] == ["can't start new thread"]
    assert not worker.threads.running()


def test_a_refused_batched_step_write_does_not_stop_the_worker(monkeypatch):
    """The fetcher writes workflow steps' successes in one transaction before it claims.
    If that write fails with an error that would come back at every try, the fetcher
    once put the successes back and failed on them forever: no claim, no success written,
    the worker's heartbeat keeping its jobs from any rescue. It now writes each step on
    its own after such an error, and goes on."""

    from django.db import IntegrityError

    from django_gator import Workflow
    from django_gator.models import WorkflowStep
    from django_gator.states import StepState
    from django_gator.worker.outcomes import Outcomes
    from django_gator.worker.queues import parse_queue_specs
    from django_gator.worker.supervisor import WorkerProcess
    from tests.testapp.jobs import DagStep

    write_steps = Outcomes.write_steps

    def refuse(self: Outcomes, batch: list[tuple[object, ...]]) -> object:
        if any(item[0].chain_id is not None for item in batch):  # type: ignore[attr-defined]
            raise IntegrityError("refused by the test")
        return write_steps(self, batch)

    monkeypatch.setattr(Outcomes, "write_steps", refuse)
    wf = Workflow(name="refused")
    wf.add(DagStep, 3, after=[wf.add(DagStep, 2, after=[wf.add(DagStep, 1)])])
    run = wf.dispatch()
    plain = Echo.dispatch_many([[i] for i in range(5)])
    worker = WorkerProcess(
        parse_queue_specs(["default", "echo"]),
        concurrency=2,
        burst=True,
        install_signal_handlers=False,
    )
    thread = start_worker_thread(worker)  # so that a wedged worker fails the test
    thread.join(60)
    if thread.is_alive():
        worker.force_stop()
        thread.join(30)
        pytest.fail("the burst worker did not end: the fetcher kept failing on the steps")

    states = WorkflowStep.objects.filter(workflow=run).values_list("state", flat=True)
    assert set(states) == {StepState.SUCCEEDED}
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.SUCCEEDED}
    assert Job.objects.filter(pk__in=[j.pk for j in plain]).count() == 5


def test_a_burst_worker_also_runs_jobs_that_its_jobs_dispatch():
    from tests.testapp.jobs import Spawner

    Spawner.dispatch("brand-new-queue")

    run_worker(concurrency=2)  # every queue, found as they appear

    assert set(Job.objects.values_list("queue", "state")) == {
        ("default", JobState.SUCCEEDED),
        ("brand-new-queue", JobState.SUCCEEDED),
    }


def test_a_retry_claimed_before_its_failed_attempt_is_put_away_keeps_every_slot(monkeypatch):
    # A failure with a retry due at once is claimed again (and started on another thread)
    # while the thread that wrote the failure is still putting it away. That thread must
    # not take the new run's place: it once did, and the worker lost an executor slot for
    # good (a burst worker hung, a long-running one slowly stopped working).
    import threading

    from django_gator.worker.outcomes import Outcomes
    from django_gator.worker.supervisor import WorkerProcess

    original = Outcomes._failure
    retried_meanwhile = threading.Event()

    def slow_write_failure(self, *args, **kwargs):
        written = original(self, *args, **kwargs)
        # The fetcher claims the retry, another thread starts it, before this one is done.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if Execution.objects.filter(attempt=2).exists():
                retried_meanwhile.set()
                break
            time.sleep(0.01)
        return written

    monkeypatch.setattr(Outcomes, "_failure", slow_write_failure)
    # One job, two threads: the second thread is free to start the retry.
    jobs = [RecordFailsFirst.dispatch(label="r")]

    done = threading.Event()
    worker: list[WorkerProcess] = []

    def drain() -> None:
        try:
            worker.append(run_worker(concurrency=2))
            done.set()
        finally:
            connections.close_all()  # this thread's

    threading.Thread(target=drain, daemon=True).start()
    assert done.wait(60), "the burst worker never finished: an executor slot was lost"
    assert retried_meanwhile.is_set(), "the retry did not start while the failure was put away"
    assert worker[0].slots.in_flight == 0
    assert worker[0].slots.running == {}
    states = set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("state", flat=True))
    assert states == {JobState.SUCCEEDED}
    assert Execution.objects.count() == 2  # the failed attempt and its retry
