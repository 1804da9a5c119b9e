"""The contract's outcome writes: each a compare-and-set on its claim (id, attempts,
reserved_by, running), refused by answering so, never by raising or by writing over a job's
new life."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from django_gator.attempts import Claim, Failure, Mark
from django_gator.engines import get_engine
from django_gator.models import Job, JobState, WorkflowStep
from django_gator.rows import InsertRow
from django_gator.states import StepState
from django_gator.workflows import Workflow
from tests.engines.conformance import covers, statements, writes
from tests.testapp.jobs import Echo
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def _failure(**fields: object) -> Failure:
    values: dict[str, object] = dict(
        dead=False, retry_in=0.0, queue="echo", error='{"e": 1}', last_error="ValueError: x"
    )
    values.update(fields)
    return Failure(**values)  # type: ignore[arg-type]


def _claim_one(worker: str = "worker-a") -> Claim:
    [job], _ = get_engine("default").claim_and_mark(worker, "echo", 1, [])
    return Claim(job.id, job.attempts)


@covers("mark_succeeded", "claim_state")
def test_outcome_writes_are_compare_and_set_on_the_claim():
    engine = get_engine("default")
    job = Echo.dispatch("cas")
    claim = _claim_one()
    assert claim.attempts == 1

    # Another worker, or a stale attempt number, cannot write this claim's outcome.
    assert engine.mark_succeeded("worker-b", [Mark(claim.id, claim.attempts, None)]) == []
    assert engine.mark_succeeded("worker-a", [Mark(claim.id, claim.attempts + 1, None)]) == []
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
    assert engine.mark_succeeded("worker-a", [Mark(claim.id, claim.attempts, '"ok"')]) == [job.pk]
    # Once written, the same write does nothing a second time.
    assert engine.mark_succeeded("worker-a", [Mark(claim.id, claim.attempts, '"ok"')]) == []
    job.refresh_from_db()
    assert (job.state, job.result) == (JobState.SUCCEEDED, "ok")
    assert engine.claim_state(job.pk) == ("succeeded", 1, "worker-a")


@covers("mark_succeeded", "mark_failed_and_insert", "mark_snoozed", "release", "claim_state")
def test_every_outcome_write_for_a_job_another_worker_reclaimed_is_refused_and_says_so():
    """worker-a's claim was given back and worker-b claimed the job again: worker-a's
    outcome, of any kind, writes nothing, answers that it did not, and the row still shows
    worker-b's claim (what the worker logs as a lost claim)."""
    engine = get_engine("default")
    job = Echo.dispatch("lost")
    stale = _claim_one("worker-a")
    assert engine.release("worker-a", [stale]) == [job.pk]
    fresh = _claim_one("worker-b")
    assert fresh.id == job.pk

    assert engine.mark_succeeded("worker-a", [Mark(stale.id, stale.attempts, '"x"')]) == []
    assert engine.mark_failed_and_insert("worker-a", stale, _failure(), []) is False
    assert engine.mark_snoozed("worker-a", stale, 30.0) is False
    assert engine.release("worker-a", [stale]) == []

    assert engine.claim_state(job.pk) == ("running", fresh.attempts, "worker-b")
    row = Job.objects.get(pk=job.pk)
    assert (row.result, row.errors or [], row.snoozes) == (None, [], 0)


@covers("mark_succeeded")
def test_a_stale_attempt_of_the_same_worker_is_refused():
    """Same worker, the job failed and was claimed again: the first attempt's mark no
    longer matches ``attempts``."""
    engine = get_engine("default")
    job = Echo.dispatch("retried")
    first = _claim_one()
    assert engine.mark_failed_and_insert("worker-a", first, _failure(), []) is True
    second = _claim_one()
    assert (second.id, second.attempts) == (job.pk, 2)
    assert engine.mark_succeeded("worker-a", [Mark(first.id, first.attempts, None)]) == []
    assert engine.claim_state(job.pk) == ("running", 2, "worker-a")


@covers("mark_succeeded")
def test_a_batch_of_marks_is_one_update_and_answers_the_ids_written():
    engine = get_engine("default")
    Echo.dispatch_many([[i] for i in range(5)])
    claimed, _ = engine.claim_and_mark("worker-a", "echo", 5, [])
    marks = [Mark(j.id, j.attempts, None if n % 2 else f'"r{n}"') for n, j in enumerate(claimed)]

    with statements() as sent:
        written = engine.mark_succeeded("worker-a", marks)

    assert sorted(written) == sorted(j.id for j in claimed)
    assert [s.split()[0].upper() for s in sent] == ["UPDATE"]
    results = dict(Job.objects.values_list("id", "result"))
    assert results == {m.id: None if m.result is None else m.result.strip('"') for m in marks}


@covers("mark_succeeded_and_insert")
def test_a_success_with_a_follow_up_inserts_it_only_if_the_mark_is_written():
    engine = get_engine("default")
    job = Echo.dispatch("chain")
    claim = _claim_one()
    row = InsertRow(
        name=Echo.name, args='["next"]', kwargs="{}", queue="echo", priority=0, run_at=None
    )

    inserted: list[int] = []
    assert engine.mark_succeeded_and_insert("worker-b", Mark(claim.id, 1), [row], inserted) is False
    assert inserted == []
    assert Job.objects.count() == 1

    assert engine.mark_succeeded_and_insert("worker-a", Mark(claim.id, 1), [row], inserted) is True
    [follow_up] = inserted
    assert Job.objects.get(pk=follow_up).args == ["next"]
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED


@covers("mark_failed_and_insert")
def test_a_failure_writes_its_retry_dead_or_cancelled_end_and_its_handler():
    engine = get_engine("default")
    retried, dead = Echo.dispatch_many([["retry"], ["dead"]])
    claims = {c.id: c for c in (_claim_one(), _claim_one())}
    handler = InsertRow(
        name=Echo.name, args='["handler"]', kwargs="{}", queue="echo", priority=0, run_at=None
    )

    assert (
        engine.mark_failed_and_insert("worker-a", claims[retried.pk], _failure(retry_in=60.0), [])
        is True
    )
    inserted: list[int] = []
    assert (
        engine.mark_failed_and_insert(
            "worker-a", claims[dead.pk], _failure(dead=True, retry_in=None), [handler], inserted
        )
        is True
    )

    retried.refresh_from_db()
    dead.refresh_from_db()
    assert (retried.state, retried.attempts, retried.last_error) == (
        JobState.FAILED,
        1,
        "ValueError: x",
    )
    assert retried.error_class == "ValueError"
    assert retried.errors == [{"e": 1}]
    assert (dead.state, dead.finished_at is not None) == (JobState.DEAD, True)
    [handler_id] = inserted
    assert Job.objects.get(pk=handler_id).args == ["handler"]


@covers("mark_failed_and_insert")
def test_an_uncharged_failure_gives_the_attempt_back():
    engine = get_engine("default")
    job = Echo.dispatch("outage")
    claim = _claim_one()
    assert engine.mark_failed_and_insert(
        "worker-a", claim, _failure(uncharged=True, outage=True), []
    )
    job.refresh_from_db()
    assert (job.state, job.attempts, job.outages) == (JobState.FAILED, 0, 1)


@covers("mark_snoozed")
def test_a_snooze_is_waiting_again_its_attempt_given_back_in_one_statement():
    engine = get_engine("default")
    job = Echo.dispatch("snooze")
    claim = _claim_one()
    with statements() as sent:
        assert engine.mark_snoozed("worker-a", claim, 3600.0) is True
    assert len(sent) == 1
    job.refresh_from_db()
    assert (job.state, job.attempts, job.snoozes) == (JobState.WAITING, 0, 1)
    assert engine.claim_and_mark("worker-a", "echo", 1, []) == ([], [])  # not due for an hour


@covers("release")
def test_released_claims_go_back_to_waiting_without_charging_the_attempt():
    engine = get_engine("default")
    job = Echo.dispatch("release")
    claim = _claim_one()

    assert engine.release("worker-a", [claim]) == [job.pk]

    job.refresh_from_db()
    assert (job.state, job.attempts, job.started_at, job.handbacks) == (
        JobState.WAITING,
        0,
        None,
        0,
    )
    again = _claim_one("worker-b")
    assert again.attempts == 1
    assert engine.release("worker-b", [again], handback=True) == [job.pk]
    job.refresh_from_db()
    assert (job.state, job.handbacks) == (JobState.WAITING, 1)


@covers("with_steps")
def test_with_steps_settles_the_workflow_step_a_write_ended():
    engine = get_engine("default")
    wf = Workflow(name="conformance")
    first = wf.add(Echo, "first")
    wf.add(Echo, "second", after=[first])
    run = wf.dispatch()
    claim = _claim_one()
    assert Job.objects.count() == 1

    inserted: list[int] = []
    written = engine.with_steps(
        [claim.id], inserted, lambda: engine.mark_succeeded("worker-a", [Mark(claim.id, 1)])
    )

    assert written == [claim.id]
    [released] = inserted
    assert Job.objects.get(pk=released).args == ["second"]
    steps = dict(WorkflowStep.objects.filter(workflow_id=run.id).values_list("position", "state"))
    assert steps == {0: StepState.SUCCEEDED, 1: StepState.RELEASED}


@covers("with_steps")
def test_with_steps_and_no_ids_is_the_write_alone():
    engine = get_engine("default")
    with statements() as sent:
        assert engine.with_steps([], None, lambda: 7) == 7
    assert sent == []


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has one writer: no deadlock")
@covers("with_steps")
def test_a_settling_write_that_loses_a_deadlock_runs_again_by_itself():
    # The worker's writes that may end a workflow step run through with_steps() in a
    # transaction of their own. Two of them lock two rows in opposite orders: the database
    # ends one to break the deadlock (InnoDB error 1213, PostgreSQL 40P01), and with_steps
    # runs that one again from the start (its write is a compare-and-set), so neither
    # caller sees the error.
    rows = [
        Execution.objects.create(job_id=-n, attempt=0, pid=0, label=f"row {n}").pk for n in range(2)
    ]
    job = Echo.dispatch("deadlock")  # not a step: settling it changes nothing
    engine = get_engine("default")
    both_hold_one = threading.Barrier(2, timeout=30)
    calls = [0, 0]
    errors: list[BaseException] = []

    def write(me: int) -> int:
        calls[me] += 1
        first, second = rows if me == 0 else rows[::-1]
        Execution.objects.filter(pk=first).update(label=f"locked by {me}")
        if calls[me] == 1:
            both_hold_one.wait()
        Execution.objects.filter(pk=second).update(label=f"written by {me}")
        return 1

    def run(me: int) -> None:
        try:
            assert engine.with_steps([job.pk], None, lambda: write(me)) == 1
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()  # this thread's

    threads = [threading.Thread(target=run, args=(me,)) for me in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert not errors, errors
    assert sorted(calls) == [1, 2], calls  # one lost the deadlock and ran again
    labels = set(Execution.objects.filter(pk__in=rows).values_list("label", flat=True))
    loser = calls.index(2)
    assert labels == {f"written by {loser}", f"locked by {loser}"}  # the rerun wrote last


@covers("mark_failed_and_insert", "release")
def test_a_failure_and_a_release_of_no_batch_member_are_one_write_each():
    engine = get_engine("default")
    Echo.dispatch_many([[1], [2]])
    first, second = _claim_one(), _claim_one()
    with statements() as sent:
        engine.mark_failed_and_insert("worker-a", first, _failure(), [])
    assert len(writes(sent)) == 1, sent
    with statements() as sent:
        engine.release("worker-a", [second])
    assert len(writes(sent)) == 1, sent
