"""The helpers users test their own code with: run_jobs(), assert_dispatched() and
GATOR_IMMEDIATE, inside Django's TestCase transaction as well as in autocommit."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.test import TestCase, override_settings
from django.utils import timezone

from django_gator import Chain
from django_gator.models import Job, JobState
from django_gator.testing import (
    TooManyJobs,
    assert_dispatched,
    assert_not_dispatched,
    run_jobs,
)
from tests.testapp.jobs import (
    AtomicBoom,
    AtomicRecord,
    Boom,
    BoomWithRetry,
    Echo,
    FetchData,
    NotifyUser,
    ProcessData,
    Record,
    SyncUser,
    add,
)
from tests.testapp.models import Execution


class RunJobsInATestCase(TestCase):
    """TestCase wraps each test in a transaction that never commits: run_jobs() must work
    on that connection, inside it."""

    def test_runs_what_is_due_and_returns_the_rows(self) -> None:
        first = Record.dispatch("a")
        second = add.dispatch(2, 3)
        later = Record.dispatch("later", wait=3600)

        ran = run_jobs()

        assert [job.pk for job in ran] == [second.pk, first.pk]  # add has priority 3
        assert [job.state for job in ran] == [JobState.SUCCEEDED] * 2
        assert ran[0].result == 5
        assert later.refresh_state() == JobState.WAITING

    def test_a_moved_clock_reaches_scheduled_jobs_and_retries(self) -> None:
        later = Record.dispatch("later", wait=timedelta(hours=2))
        flaky = BoomWithRetry.dispatch()  # retries after 60 s, twice

        run_jobs()
        assert flaky.refresh_state() == JobState.FAILED
        assert later.refresh_state() == JobState.WAITING

        assert run_jobs(advance=30) == []  # the retry is 60 s away

        # Two minutes on, the second attempt is due, and so is the third, 60 s after it.
        with pytest.raises(ValueError, match="attempt 3 failed"):
            run_jobs(advance=timedelta(minutes=2))
        flaky.refresh_from_db()
        assert (flaky.state, flaky.attempts, flaky.queue) == (JobState.DEAD, 3, "retries")
        assert [e["message"] for e in flaky.errors] == [
            "attempt 1 failed",
            "attempt 2 failed",
            "attempt 3 failed",
        ]
        assert later.refresh_state() == JobState.WAITING
        run_jobs(now=timezone.now() + timedelta(hours=3))
        assert later.refresh_state() == JobState.SUCCEEDED

    def test_errors_can_be_left_on_the_rows(self) -> None:
        job = Boom.dispatch("quietly")
        ran = run_jobs(raise_errors=False)
        assert [(j.pk, j.state, j.last_error) for j in ran] == [
            (job.pk, JobState.DEAD, "RuntimeError: quietly")
        ]

    def test_chains_run_through_in_order(self) -> None:
        Chain(FetchData, ProcessData, NotifyUser).dispatch("o-1")
        ran = run_jobs()
        labels = list(Execution.objects.order_by("id").values_list("label", flat=True))
        assert labels == ["FetchData:o-1", "ProcessData:o-1", "NotifyUser:o-1"]
        assert [j.name for j in ran] == [
            FetchData.name,
            ProcessData.name,
            ProcessData.name,
            ProcessData.name,
            NotifyUser.name,
        ]

    def test_atomic_jobs_roll_back_in_a_savepoint(self) -> None:
        AtomicRecord.dispatch("kept")
        AtomicBoom.dispatch("dropped")
        run_jobs(raise_errors=False)
        assert list(Execution.objects.values_list("label", flat=True)) == ["kept"]

    def test_queue_filter_and_the_runaway_guard(self) -> None:
        Echo.dispatch(1)
        Record.dispatch("default queue")
        assert [j.name for j in run_jobs(queue="echo")] == [Echo.name]
        assert Job.objects.filter(state=JobState.WAITING).count() == 1
        for i in range(3):
            Record.dispatch(str(i))
        with pytest.raises(TooManyJobs, match="ran 2 jobs and more are due"):
            run_jobs(max_jobs=2)

    def test_bad_clock_arguments(self) -> None:
        with pytest.raises(ValueError, match="either now= or advance="):
            run_jobs(now=timezone.now(), advance=1)
        with pytest.raises(ValueError, match="timezone-aware"):
            run_jobs(now=timezone.now().replace(tzinfo=None))


class AssertDispatched(TestCase):
    def test_matches_arguments_as_the_handler_sees_them(self) -> None:
        SyncUser.dispatch(5, reason="signup")
        add.dispatch(1, b=2)

        rows = assert_dispatched(SyncUser)
        assert len(rows) == 1
        assert_dispatched(SyncUser, 5, reason="signup")
        assert_dispatched(SyncUser, user_id=5, reason="signup")
        assert_dispatched(add, 1, 2, count=1)
        assert_not_dispatched(SyncUser, 6)
        assert_not_dispatched(Record)

    def test_failures_say_what_was_dispatched(self) -> None:
        SyncUser.dispatch(5, reason="signup")
        with pytest.raises(AssertionError) as info:
            assert_dispatched(SyncUser, 6)
        message = str(info.value)
        assert "expected tests.testapp.jobs.SyncUser(6) to be dispatched" in message
        assert "1 was dispatched" in message
        assert "args=[5] kwargs={'reason': 'signup'}" in message

        with pytest.raises(AssertionError, match="dispatched 2 times, found 1"):
            assert_dispatched(SyncUser, count=2)
        with pytest.raises(AssertionError, match="on queue 'other'"):
            assert_dispatched(SyncUser, queue="other")
        with pytest.raises(AssertionError, match=r"expected no tests\.testapp\.jobs\.SyncUser"):
            assert_not_dispatched(SyncUser)


@override_settings(GATOR_IMMEDIATE=True)
class ImmediateInATestCase(TestCase):
    def test_dispatch_runs_the_job_at_once(self) -> None:
        job = Record.dispatch("now")
        job.refresh_from_db()
        assert (job.state, job.result) == (JobState.SUCCEEDED, {"label": "now", "attempt": 1})

    def test_a_dead_job_raises_at_dispatch_after_its_row_is_written(self) -> None:
        with pytest.raises(RuntimeError, match="loud"):
            Boom.dispatch("loud")
        assert Job.objects.get().state == JobState.DEAD

    def test_scheduled_jobs_wait_for_run_jobs(self) -> None:
        job = Record.dispatch("later", wait=60)
        assert job.refresh_state() == JobState.WAITING
        run_jobs(advance=61)
        assert job.refresh_state() == JobState.SUCCEEDED

    def test_a_chain_runs_to_the_end(self) -> None:
        Chain(FetchData, NotifyUser).dispatch("c")
        assert set(Job.objects.values_list("state", flat=True)) == {JobState.SUCCEEDED}
        assert Job.objects.count() == 2


@pytest.mark.django_db(transaction=True)
@override_settings(GATOR_IMMEDIATE=True)
def test_immediate_jobs_wait_for_the_commit_and_vanish_with_a_rollback():
    with transaction.atomic():
        job = Record.dispatch("after commit")
        assert job.refresh_state() == JobState.WAITING
        assert not Execution.objects.exists()
    assert job.refresh_state() == JobState.SUCCEEDED

    with transaction.atomic():
        Record.dispatch("rolled back")
        transaction.set_rollback(True)
    assert list(Execution.objects.values_list("label", flat=True)) == ["after commit"]


@pytest.mark.django_db(transaction=True)
@override_settings(GATOR_IMMEDIATE=True)
def test_immediate_respects_on_commit_dispatch():
    with transaction.atomic():
        job = Record.dispatch("deferred", on_commit=True)
        assert job.pk is None
    assert job.refresh_state() == JobState.SUCCEEDED
