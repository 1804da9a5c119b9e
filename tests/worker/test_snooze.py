"""Snooze: ``raise Snooze(30)`` from handle() puts the job back to waiting, due 30 s later,
without spending an attempt or recording an error; the snoozes are counted on the row."""

from __future__ import annotations

import logging
import re
import signal
import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from django_gator import Chain, Snooze, signals
from django_gator.attempts import Claim, Snoozed
from django_gator.engines import get_engine
from django_gator.models import Job, JobState
from django_gator.testing import run_jobs
from django_gator.worker.outcomes import Outcomes
from tests.conftest import run_worker, wait_for, worker_output
from tests.testapp import jobs
from tests.testapp.jobs import (
    TRACE,
    AsyncSnooze,
    AtomicSnooze,
    FetchData,
    NotifyUser,
    SnoozesBadly,
    SnoozesOnceUnique,
    SnoozeStep,
    SnoozesThenSucceeds,
    SnoozesThroughSubclass,
    SnoozesWhenCancelled,
    snooze_until_file,
)
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def due_in(row: Job) -> float:
    """Seconds until ``row`` is due (after refreshing it)."""
    row.refresh_from_db()
    return (row.next_execution_at - timezone.now()).total_seconds()


def make_due(row: Job) -> None:
    """The snooze's time has come (without waiting for it)."""
    Job.objects.filter(pk=row.pk).update(next_execution_at=timezone.now())


def labels(row: Job) -> list[str]:
    ledger = Execution.objects.filter(job_id=row.pk).order_by("id")
    return list(ledger.values_list("label", flat=True))


# -- the exception -------------------------------------------------------------------------


def test_snooze_takes_seconds_or_a_timedelta():
    assert Snooze(30).seconds == 30.0
    assert Snooze(0.25).seconds == 0.25
    assert Snooze(0).seconds == 0.0
    assert Snooze(timedelta(minutes=2)).seconds == 120.0
    assert str(Snooze(30)) == "snoozed for 30 s"


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (-1, ValueError, "Snooze() takes a finite delay of 0 seconds or more, got -1"),
        (float("nan"), ValueError, "got nan"),
        (float("inf"), ValueError, "got inf"),
        (timedelta(seconds=-5), ValueError, "got datetime.timedelta(days=-1, seconds=86395)"),
        ("30", TypeError, "takes seconds (an int or float) or a timedelta, got '30' (str)"),
        (True, TypeError, "got True (bool)"),
        (None, TypeError, "got None (NoneType)"),
        (10**9, ValueError, "Snooze() takes at most 31622400 seconds (366 days), got 1000000000"),
    ],
)
def test_a_bad_delay_is_refused_naming_the_value(value, error, message):
    with pytest.raises(error) as info:
        Snooze(value)
    assert message in str(info.value)


# -- through a worker ------------------------------------------------------------------------


def test_a_snoozed_job_waits_uncharged_then_runs_when_due(caplog):
    TRACE.clear()
    caplog.set_level(logging.INFO, logger="django_gator")
    row = SnoozesThenSucceeds.dispatch(times=1, seconds=30)

    run_worker("snooze")

    [line] = [m for m in caplog.messages if m.startswith(f"Processed job id={row.pk} ")]
    assert "result=snoozed" in line
    assert "attempt=1" in line
    assert line.endswith("snoozed_s=30")

    assert 25 < due_in(row) <= 30
    assert row.state == JobState.WAITING
    assert row.attempts == 0  # the claim's attempt was given back
    assert row.snoozes == 1
    assert row.errors is None
    assert row.last_error == ""
    assert row.error_class is None
    assert row.finished_at is None
    assert row.result is None
    assert labels(row) == ["attempt 1"]

    run_worker("snooze")  # not due yet: nothing runs
    assert labels(row) == ["attempt 1"]

    make_due(row)
    run_worker("snooze")

    row.refresh_from_db()
    assert row.state == JobState.SUCCEEDED
    assert row.result == {"attempt": 1, "runs": 2}
    assert row.attempts == 1
    assert row.snoozes == 1
    assert row.errors is None
    assert labels(row) == ["attempt 1", "attempt 1"]
    assert TRACE == []  # on_error() is not called for a snooze


def test_snoozes_are_counted_and_leave_the_retry_policy_alone():
    # max_retries=1: if snoozes spent attempts, the fourth run would be refused.
    row = SnoozesThenSucceeds.dispatch(times=3, seconds=0)

    run_worker("snooze")  # a 0 s snooze is due at once: the burst worker runs it again

    row.refresh_from_db()
    assert row.state == JobState.SUCCEEDED
    assert (row.attempts, row.snoozes) == (1, 3)
    assert labels(row) == ["attempt 1"] * 4


def test_a_timedelta_snooze():
    row = SnoozesThenSucceeds.dispatch(times=1, minutes=10)

    run_worker("snooze")

    assert 590 < due_in(row) <= 600
    assert (row.state, row.attempts, row.snoozes) == (JobState.WAITING, 0, 1)


def test_an_async_handler_snoozes():
    row = AsyncSnooze.dispatch(seconds=45)

    run_worker("snooze")

    assert 40 < due_in(row) <= 45
    assert (row.state, row.attempts, row.snoozes) == (JobState.WAITING, 0, 1)
    make_due(row)
    run_worker("snooze")
    row.refresh_from_db()
    assert (row.state, row.result, row.attempts) == (JobState.SUCCEEDED, "async done", 1)


def test_a_job_function_snoozes(tmp_path):
    row = snooze_until_file.dispatch(str(tmp_path / "flag"))

    run_worker("snooze")

    assert 25 < due_in(row) <= 30
    assert (row.state, row.attempts, row.snoozes) == (JobState.WAITING, 0, 1)


def test_an_atomic_job_that_snoozes_rolls_back_its_writes(tmp_path):
    row = AtomicSnooze.dispatch("export", str(tmp_path / "ran"))

    run_worker("snooze")

    assert 25 < due_in(row) <= 30
    assert (row.state, row.attempts, row.snoozes) == (JobState.WAITING, 0, 1)
    assert labels(row) == []  # written inside the job's transaction, rolled back

    make_due(row)
    run_worker("snooze")
    row.refresh_from_db()
    assert (row.state, row.attempts) == (JobState.SUCCEEDED, 1)
    assert labels(row) == ["export done"]


def test_a_chain_step_that_snoozes_holds_the_chain():
    first = Chain(FetchData, SnoozeStep, NotifyUser).dispatch("o5")

    run_worker("chains")

    rows = list(Job.objects.filter(chain_id=first.chain_id).order_by("chain_position"))
    assert [(r.name, r.state, r.snoozes) for r in rows] == [
        (FetchData.name, JobState.SUCCEEDED, 0),
        (SnoozeStep.name, JobState.WAITING, 1),  # the next step is not dispatched yet
    ]
    make_due(rows[1])
    run_worker("chains")

    rows = list(Job.objects.filter(chain_id=first.chain_id).order_by("chain_position"))
    assert [(r.name, r.state, r.attempts) for r in rows] == [
        (FetchData.name, JobState.SUCCEEDED, 1),
        (SnoozeStep.name, JobState.SUCCEEDED, 1),
        (NotifyUser.name, JobState.SUCCEEDED, 1),
    ]


def test_a_snoozed_unique_job_keeps_its_key():
    row = SnoozesOnceUnique.dispatch(times=1)

    run_worker("snooze")

    again = SnoozesOnceUnique.dispatch(times=1)
    assert again.pk == row.pk  # still active: the key is held
    assert Job.objects.filter(name=SnoozesOnceUnique.name).count() == 1


def test_job_finished_says_waiting_and_carries_the_snooze():
    seen: list[tuple[str, object]] = []

    def receiver(sender, job, state, exception, duration, **kwargs):
        seen.append((state, exception))

    signals.job_finished.connect(receiver, sender=SnoozesThenSucceeds)
    try:
        row = SnoozesThenSucceeds.dispatch(times=1, seconds=30)
        run_worker("snooze")
        make_due(row)
        run_worker("snooze")
    finally:
        signals.job_finished.disconnect(receiver, sender=SnoozesThenSucceeds)

    assert [state for state, _ in seen] == [JobState.WAITING, JobState.SUCCEEDED]
    assert isinstance(seen[0][1], Snooze)
    assert seen[0][1].seconds == 30
    assert seen[1][1] is None


@pytest.mark.parametrize("kind", sorted(jobs.BAD_SNOOZES))
def test_a_bad_snooze_fails_the_job_naming_the_value(kind):
    row = SnoozesBadly.dispatch(kind)

    run_worker("snooze")

    row.refresh_from_db()
    assert row.state == JobState.DEAD  # no retry policy: the failure is kept, not lost
    assert row.snoozes == 0
    assert row.attempts == 1
    value = jobs.BAD_SNOOZES[kind]
    assert row.last_error.split(": ", 1)[0] in ("ValueError", "TypeError")
    assert f"got {value!r}" in row.last_error
    assert len(row.errors) == 1


def test_a_snooze_whose_delay_was_spoiled_after_the_check_fails_the_job():
    row = SnoozesThroughSubclass.dispatch()

    run_worker("snooze")

    row.refresh_from_db()
    assert (row.state, row.snoozes) == (JobState.DEAD, 0)
    assert row.last_error == (
        "ValueError: Snooze() takes a finite delay of 0 seconds or more, got -5"
    )


# -- immediate mode and run_jobs -------------------------------------------------------------


@override_settings(GATOR_IMMEDIATE=True)
def test_immediate_mode_leaves_a_snoozed_job_waiting_for_its_time():
    row = SnoozesThenSucceeds.dispatch(times=1, seconds=30)

    assert 25 < due_in(row) <= 30
    assert (row.state, row.attempts, row.snoozes) == (JobState.WAITING, 0, 1)
    assert run_jobs() == []  # not due yet

    [ran] = run_jobs(advance=60)
    assert ran.pk == row.pk
    assert (ran.state, ran.attempts, ran.snoozes) == (JobState.SUCCEEDED, 1, 1)


def test_run_jobs_runs_a_snoozed_job_again_when_the_clock_reaches_it():
    row = SnoozesThenSucceeds.dispatch(times=2, seconds=30)

    assert [r.state for r in run_jobs()] == [JobState.WAITING]
    assert run_jobs(advance=20) == []  # not due yet
    # Five minutes on, it snoozes again (30 s later is still before the clock), then runs.
    ran = run_jobs(advance=timedelta(minutes=5))
    assert [r.pk for r in ran] == [row.pk, row.pk]
    row.refresh_from_db()
    assert (row.state, row.attempts, row.snoozes) == (JobState.SUCCEEDED, 1, 2)


# -- cancellation and lost claims ------------------------------------------------------------


def test_a_cancel_asked_for_while_running_wins_over_a_snooze(tmp_path):
    flag = tmp_path / "running"
    row = SnoozesWhenCancelled.dispatch(str(flag))

    def work() -> None:
        try:
            run_worker("snooze")
        finally:
            connections.close_all()  # this thread's

    worker = threading.Thread(target=work)
    worker.start()
    try:
        wait_for(flag.exists)
        assert Job.objects.filter(pk=row.pk).cancel() == 1
    finally:
        worker.join(timeout=30)

    row.refresh_from_db()
    assert row.state == JobState.CANCELLED
    assert row.finished_at is not None
    assert row.snoozes == 0
    assert row.errors is None


def test_a_snooze_for_a_lost_claim_writes_nothing(caplog):
    engine = get_engine("default")
    engine.register_worker("snooze-test", "h", 1, "[]", 1)
    outcomes = Outcomes(engine, "snooze-test")
    row = SnoozesThenSucceeds.dispatch()
    [claimed] = engine.claim("snooze-test", "snooze", 1)
    # Taken back meanwhile (rescued and claimed by another worker).
    Job.objects.filter(pk=row.pk).update(reserved_by="someone-else", attempts=2)

    assert outcomes.record(claimed, Snoozed(30.0, Snooze(30)), 1.0, batch=False) is None

    row.refresh_from_db()
    assert (row.state, row.reserved_by, row.attempts, row.snoozes) == (
        JobState.RUNNING,
        "someone-else",
        2,
        0,
    )
    assert "claim was lost" in caplog.text


def test_a_snooze_that_landed_before_its_answer_was_lost_counts_as_written():
    engine = get_engine("default")
    engine.register_worker("snooze-test", "h", 1, "[]", 1)
    outcomes = Outcomes(engine, "snooze-test")
    row = SnoozesThenSucceeds.dispatch()
    [claimed] = engine.claim("snooze-test", "snooze", 1)
    # The first try committed, then the connection broke before the worker saw it.
    assert engine.mark_snoozed("snooze-test", Claim.of(claimed), 30.0)

    assert outcomes.record(claimed, Snoozed(30.0, Snooze(30)), 1.0, batch=False) == "waiting"
    row.refresh_from_db()
    assert (row.state, row.attempts, row.snoozes) == (JobState.WAITING, 0, 1)


# -- a real worker process -------------------------------------------------------------------


def test_a_worker_process_snoozes_a_job_and_runs_it_when_due(spawn_worker, tmp_path):
    flag = tmp_path / "flag"
    row = snooze_until_file.dispatch(str(flag), seconds=30)
    proc = spawn_worker("--queue", "snooze", "--concurrency", "2")

    wait_for(lambda: Job.objects.get(pk=row.pk).snoozes == 1)
    assert flag.exists()
    assert 20 < due_in(row) <= 30
    assert (row.state, row.attempts, row.errors, row.last_error) == (
        JobState.WAITING,
        0,
        None,
        "",
    )

    make_due(row)
    wait_for(lambda: row.refresh_state() == JobState.SUCCEEDED, timeout=15)
    row.refresh_from_db()
    assert (row.result, row.attempts, row.snoozes) == ("ran after the snooze", 1, 1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, worker_output(proc)


# -- the admin -------------------------------------------------------------------------------


def test_the_admin_shows_the_snoozes_in_the_list_and_on_the_job(admin_client):
    row = SnoozesThenSucceeds.dispatch(times=1, seconds=30)
    run_worker("snooze")

    listing = admin_client.get(reverse("admin:django_gator_job_changelist")).content.decode()
    detail = admin_client.get(reverse("admin:django_gator_job_change", args=[row.pk]))

    [cell] = re.findall(r'<td class="field-next_run">(.*?)</td>', listing)
    assert cell.endswith(
        '<br><span class="snoozes" title="times handle() raised Snooze (no '
        'attempt counted)">1 snooze</span>'
    )
    assert "<time " in cell
    assert '<td class="field-attempts">0</td>' in listing
    body = detail.content.decode()
    # The value follows the label (after the help text on Django 6.1, before it on 5.2).
    field = body.partition("<label>Snoozes:</label>")[2].partition("<label>")[0]
    assert '<div class="readonly">1</div>' in field, body
