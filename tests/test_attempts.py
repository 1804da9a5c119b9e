"""The outcome vocabulary (django_gator.attempts): what each outcome's constructors build,
how metrics and traces name it, and the marks and claims the engines are given."""

from __future__ import annotations

import dataclasses

import pytest

from django_gator.attempts import Claim, Failure, Mark, Snoozed, Success, batches_of
from django_gator.exceptions import Snooze
from tests.factories import claimed_job


def test_each_outcome_is_labelled_as_metrics_and_traces_name_it():
    assert Success('"ok"').label == "succeeded"
    assert Snoozed(30.0, Snooze(30)).label == "snoozed"
    assert Failure.retry("q", "{}", "E: x", after=5.0).label == "failed"
    assert Failure.discard("q", "{}", "E: x").label == "dead"
    assert Failure.cancel("q", "{}", "E: x").label == "cancelled"
    # Not the job's fault: retried, so "failed", whatever the cause.
    assert Failure.give_back("q", "{}", "E: x", after=1.0).label == "failed"
    assert Failure.give_back("q", "{}", "E: x", after=1.0, outage=True).label == "failed"


def test_a_retry_is_charged_and_due_after_its_wait():
    exc = ValueError("no")
    failure = Failure.retry("later", '{"n":1}', "ValueError: no", after=2.5, exception=exc)
    assert failure == Failure(
        dead=False,
        retry_in=2.5,
        queue="later",
        error='{"n":1}',
        last_error="ValueError: no",
        exception=exc,
    )
    assert failure.state == "failed"
    assert (failure.uncharged, failure.outage, failure.handback, failure.cancelled) == (
        False,
        False,
        False,
        False,
    )


def test_a_discarded_or_cancelled_attempt_is_not_retried():
    dead = Failure.discard("q", "{}", "E: x")
    assert (dead.dead, dead.retry_in, dead.cancelled, dead.state) == (True, None, False, "dead")
    cancelled = Failure.cancel("q", "{}", "E: x")
    assert (cancelled.dead, cancelled.retry_in, cancelled.cancelled) == (False, None, True)
    assert cancelled.state == "cancelled"


def test_a_given_back_attempt_is_uncharged_and_an_outage_says_so():
    unknown = Failure.give_back("q", "{}", "E: x", after=5.0)
    assert (unknown.dead, unknown.retry_in, unknown.uncharged, unknown.outage) == (
        False,
        5.0,
        True,
        False,
    )
    outage = Failure.give_back("q", "{}", "E: x", after=1.0, outage=True)
    assert (outage.uncharged, outage.outage, outage.handback) == (True, True, False)


def test_a_charged_handback_and_a_replaced_error_leave_the_failure_as_it_was():
    failure = Failure.retry("q", "{}", "E: x", after=5.0)
    handback = failure.charging_handback()
    assert handback.handback
    assert not failure.handback
    assert dataclasses.replace(handback, handback=False) == failure
    stored = failure.with_error('{"e":1}', "E: y")
    assert (stored.error, stored.last_error) == ('{"e":1}', "E: y")
    assert (failure.error, failure.last_error) == ("{}", "E: x")
    assert dataclasses.replace(stored, error="{}", last_error="E: x") == failure


@pytest.mark.parametrize(
    "outcome",
    [Success(None), Snoozed(1.0, Snooze(1)), Failure.discard("q", "{}", "E: x")],
    ids=["success", "snoozed", "failure"],
)
def test_outcomes_are_frozen(outcome):
    field = dataclasses.fields(outcome)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(outcome, field, None)


def test_a_mark_and_a_claim_carry_the_jobs_batch():
    member = claimed_job(7, attempts=2, batch_id=40)
    alone = claimed_job(8, attempts=1)
    assert Mark.of(member, '"r"') == Mark(id=7, attempts=2, result='"r"', batch_id=40)
    assert Mark.of(alone, None) == Mark(8, 1)
    assert Claim.of(member) == Claim(id=7, attempts=2, batch_id=40)
    assert Claim.of(alone) == Claim(8, 1)


def test_batches_of_names_each_batch_once_in_lock_order():
    items = [Mark(1, 1, None, 9), Mark(2, 1), Mark(3, 1, None, 4), Mark(4, 2, None, 9)]
    assert batches_of(items) == [4, 9]
    assert batches_of([Claim(1, 1), Claim(2, 1, 3)]) == [3]
    assert batches_of([]) == []
