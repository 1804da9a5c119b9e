"""Outcomes: the one writer of an attempt's outcome, used alone (no worker threads)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from django_gator import Workflow
from django_gator.attempts import Mark, Success
from django_gator.engines import get_engine
from django_gator.exceptions import JobTimeout
from django_gator.models import Job, JobState, WorkflowStep
from django_gator.states import StepState
from django_gator.worker.execution import failure_for
from django_gator.worker.outcomes import DEFERRED, Outcomes
from tests.testapp.jobs import Boom, DagStep, Echo

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "outcomes-test"


@pytest.fixture
def outcomes() -> Outcomes:
    engine = get_engine("default")
    engine.register_worker(WORKER, "h", 1, "[]", 1)
    return Outcomes(engine, WORKER)


def test_a_failure_is_written_with_its_error_and_payload_kept(outcomes):
    row = Boom.dispatch("payload")
    [claimed] = outcomes.engine.claim(WORKER, row.queue, 1)
    failure = failure_for(claimed, WORKER, ValueError("no good"))

    assert outcomes.record(claimed, failure, 3.0, batch=True) == "dead"

    row.refresh_from_db()
    assert row.state == JobState.DEAD
    assert row.args == ["payload"]
    assert row.last_error == "ValueError: no good"
    assert row.errors[-1]["worker"] == WORKER


def test_a_plain_success_is_left_for_the_batched_mark(outcomes):
    row = Echo.dispatch("x")
    [claimed] = outcomes.engine.claim(WORKER, "echo", 1)
    success = Success('"x"')

    assert outcomes.record(claimed, success, 1.0, batch=True) == DEFERRED
    assert Job.objects.get(pk=row.pk).state == JobState.RUNNING  # nothing written yet

    outcomes.write_batch([(claimed, success, 1.0)])
    assert Job.objects.get(pk=row.pk).state == JobState.SUCCEEDED


def test_an_outcome_for_a_lost_claim_writes_nothing(outcomes, caplog):
    row = Echo.dispatch("x")
    [claimed] = outcomes.engine.claim(WORKER, "echo", 1)
    # Taken back meanwhile (another worker rescued it, and claimed it again).
    Job.objects.filter(pk=row.pk).update(reserved_by="someone-else", attempts=2)

    timeout = failure_for(claimed, WORKER, JobTimeout("late"))
    assert outcomes.record(claimed, timeout, 1.0, batch=False) is None
    assert outcomes.record(claimed, Success(None), 1.0, batch=False) is None

    row.refresh_from_db()
    assert (row.state, row.reserved_by, row.attempts) == (JobState.RUNNING, "someone-else", 2)
    assert not row.errors  # no entry for the discarded failure
    assert "claim was lost" in caplog.text


def test_a_write_that_landed_before_its_answer_was_lost_counts_as_written(outcomes):
    Echo.dispatch("x")
    [claimed] = outcomes.engine.claim(WORKER, "echo", 1)
    # The first try committed, then the connection broke before the worker saw it.
    assert outcomes.engine.mark_succeeded(WORKER, [Mark(claimed.id, claimed.attempts, None)])

    assert outcomes.landed(claimed, "succeeded")
    assert outcomes.record(claimed, Success(None), 1.0, batch=False) == "succeeded"
    assert not outcomes.landed(claimed, "failed")


def test_release_gives_a_claim_back_uncharged(outcomes):
    row = Echo.dispatch("x")
    [claimed] = outcomes.engine.claim(WORKER, "echo", 1)

    assert outcomes.release([claimed]) == [row.pk]

    row.refresh_from_db()
    assert row.state == JobState.WAITING
    assert row.attempts == 0


def test_only_a_job_that_was_running_counts_a_hand_back(outcomes):
    """A claim given back before it started (pending in the slots when the worker stopped,
    a suspect not yet run alone, an orphan of a lost claim answer) is released as before:
    not counted. A job cut while it ran is."""
    engine, worker = outcomes.engine, WORKER
    row = Echo.dispatch("x")

    [claimed] = engine.claim(worker, "echo", 1)
    assert outcomes.release([claimed]) == [row.pk]
    row.refresh_from_db()
    assert (row.state, row.attempts, row.handbacks) == (JobState.WAITING, 0, 0)

    [claimed] = engine.claim(worker, "echo", 1)
    assert claimed.handbacks == 0
    with override_settings(GATOR_MAX_HANDBACKS=2):
        assert outcomes.hand_back([claimed]) == [row.pk]
    row.refresh_from_db()
    assert (row.state, row.attempts, row.handbacks) == (JobState.WAITING, 0, 1)

    # The claim reads the count; the next hand-back reaches the bound of 2 and charges.
    [claimed] = engine.claim(worker, "echo", 1)
    assert claimed.handbacks == 1
    with override_settings(GATOR_MAX_HANDBACKS=2):
        assert outcomes.hand_back([claimed], lambda job: 1500.0) == []
    row.refresh_from_db()
    assert (row.state, row.attempts, row.handbacks) == (JobState.DEAD, 1, 2)
    assert row.errors[-1]["class"] == "django_gator.exceptions.JobHandedBack"


def test_hand_backs_are_never_charged_with_no_bound(outcomes):
    row = Echo.dispatch("x")
    with override_settings(GATOR_MAX_HANDBACKS=None):
        for _ in range(4):
            [claimed] = outcomes.engine.claim(WORKER, "echo", 1)
            assert outcomes.hand_back([claimed]) == [row.pk]
    row.refresh_from_db()
    assert (row.state, row.attempts, row.handbacks) == (JobState.WAITING, 0, 4)


def _batch_step_claimed(outcomes: Outcomes) -> tuple[Any, list[Any]]:
    """A workflow whose first step is a batch of two members and whose second step waits
    for it; the members claimed."""
    wf = Workflow(name="batched marks")
    wf.add(DagStep, 1, after=[wf.add_batch(DagStep, [[0], [0]])])
    run = wf.dispatch()
    claimed = outcomes.engine.claim(WORKER, "default", 10)
    assert len(claimed) == 2
    return run, claimed


def _step_states(run: Any) -> dict[int, str]:
    return dict(WorkflowStep.objects.filter(workflow=run).values_list("position", "state"))


def test_workflow_steps_successes_are_batched_and_settle_their_workflow_together(outcomes):
    # A step's success is left for the fetcher's batched mark like any other; written
    # together, the members' marks complete the batch step and release the next step in
    # the same transaction.
    run, claimed = _batch_step_claimed(outcomes)
    batch = [(job, Success(None), 1.0) for job in claimed]
    for job, success, elapsed in batch:
        assert outcomes.record(job, success, elapsed, batch=True) == DEFERRED
    assert _step_states(run) == {0: StepState.RELEASED, 1: StepState.BLOCKED}

    outcomes.write_batch(batch)

    assert _step_states(run) == {0: StepState.SUCCEEDED, 1: StepState.RELEASED}
    assert Job.objects.filter(chain_id=run.id, chain_position=1).count() == 1


def test_a_batched_step_mark_sent_again_after_a_lost_answer_still_settles(outcomes):
    # The first member's mark committed (settling nothing: the other member was running)
    # and its answer was lost; the fetcher sends it again with the second member's. The
    # engine may not tell which of the two landed (MariaDB answers all or none, here
    # none): the batch step is settled anyway, and the next step released once.
    run, claimed = _batch_step_claimed(outcomes)
    first, second = claimed
    outcomes.write_steps([(first, Success(None), 1.0)])
    assert _step_states(run) == {0: StepState.RELEASED, 1: StepState.BLOCKED}

    marks, written = outcomes.write_steps([(job, Success(None), 1.0) for job in claimed])

    assert marks == []
    assert set(written) <= {second.id}
    assert _step_states(run) == {0: StepState.SUCCEEDED, 1: StepState.RELEASED}
    assert Job.objects.filter(chain_id=run.id, chain_position=1).count() == 1
    assert outcomes.landed(first, JobState.SUCCEEDED)
    assert outcomes.landed(second, JobState.SUCCEEDED)


def test_steps_whose_batched_write_is_refused_are_written_one_at_a_time(outcomes, monkeypatch):
    # A batched write that fails with an error a retry would meet again (here injected:
    # the database refusing it) must not leave the steps unwritten: each step's success
    # is written in a transaction of its own, which settles the workflow as the batched
    # write would have.
    from django.db import IntegrityError

    run, claimed = _batch_step_claimed(outcomes)
    batch = [(job, Success(None), 1.0) for job in claimed]
    plain = Echo.dispatch("plain")
    [claimed_plain] = outcomes.engine.claim(WORKER, "echo", 1)
    batch.append((claimed_plain, Success(None), 1.0))

    def refuse(*args: Any) -> Any:
        raise IntegrityError("refused by the test")

    monkeypatch.setattr(Outcomes, "write_steps", refuse)
    outcomes.write_batch(batch)

    assert _step_states(run) == {0: StepState.SUCCEEDED, 1: StepState.RELEASED}
    assert Job.objects.filter(chain_id=run.id, chain_position=1).count() == 1
    assert set(
        Job.objects.filter(pk__in=[j.id for j in claimed] + [plain.pk]).values_list(
            "state", flat=True
        )
    ) == {JobState.SUCCEEDED}


def _refuse_batched_step_writes(outcomes: Outcomes, monkeypatch: Any, *writes: str) -> int:
    """Make the batched write of steps' successes fail as refused, and each engine write
    named in ``writes`` too when it concerns the first claimed step; returns that step."""
    from django.db import IntegrityError

    def refuse(*args: Any) -> Any:
        raise IntegrityError("refused by the test")

    monkeypatch.setattr(Outcomes, "write_steps", refuse)
    originals = {name: getattr(outcomes.engine, name) for name in writes}
    ids_of = {  # the job ids each write is about, from its second argument
        "mark_succeeded_and_insert": lambda done: [done.id],
        "mark_failed_and_insert": lambda claim: [claim.id],
        "release": lambda claims: [claim.id for claim in claims],
    }
    bad: list[int] = []
    for name in writes:

        def refused_for_bad(worker_id: str, about: Any, *args: Any, _name: str = name) -> Any:
            if bad[0] in ids_of[_name](about):
                raise IntegrityError(f"{_name} refused by the test")
            return originals[_name](worker_id, about, *args)

        monkeypatch.setattr(outcomes.engine, name, refused_for_bad)
    return bad


def test_a_step_whose_own_success_write_is_refused_too_fails_its_attempt(outcomes, monkeypatch):
    run, claimed = _batch_step_claimed(outcomes)
    bad = _refuse_batched_step_writes(outcomes, monkeypatch, "mark_succeeded_and_insert")
    bad.append(claimed[0].id)

    outcomes.write_batch([(job, Success(None), 1.0) for job in claimed])

    failed = Job.objects.get(pk=claimed[0].id)
    assert failed.state == JobState.FAILED  # to be retried (DagStep retries)
    assert "IntegrityError: mark_succeeded_and_insert refused by the test" in failed.last_error
    assert Job.objects.get(pk=claimed[1].id).state == JobState.SUCCEEDED
    assert _step_states(run) == {0: StepState.RELEASED, 1: StepState.BLOCKED}


def test_a_step_none_of_whose_writes_succeeds_is_left_running_and_the_rest_goes_on(
    outcomes, monkeypatch, caplog
):
    run, claimed = _batch_step_claimed(outcomes)
    bad = _refuse_batched_step_writes(
        outcomes, monkeypatch, "mark_succeeded_and_insert", "mark_failed_and_insert", "release"
    )
    bad.append(claimed[0].id)
    plain = Echo.dispatch("plain")
    [claimed_plain] = outcomes.engine.claim(WORKER, "echo", 1)
    batch = [(job, Success(None), 1.0) for job in [*claimed, claimed_plain]]

    rest = outcomes.write_steps_alone(batch)  # raises nothing

    assert rest == batch[2:]  # the plain success, still to write
    assert Job.objects.get(pk=claimed[0].id).state == JobState.RUNNING
    assert f"Could not write step id={claimed[0].id} at all" in caplog.text
    assert Job.objects.get(pk=claimed[1].id).state == JobState.SUCCEEDED
    assert Job.objects.get(pk=plain.pk).state == JobState.RUNNING
    assert _step_states(run) == {0: StepState.RELEASED, 1: StepState.BLOCKED}
