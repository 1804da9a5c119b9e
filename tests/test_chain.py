"""Chains: each step only after the previous one succeeded, written in one transaction."""

from __future__ import annotations

import signal
import uuid

import pytest
from django.db import transaction

from django_gator import Chain
from django_gator.models import Job, JobState
from tests.conftest import run_worker, wait_for, worker_output
from tests.testapp.jobs import (
    BrokenStep,
    ChainFailed,
    Echo,
    FetchData,
    NotifyUser,
    ProcessData,
    SlowProcessData,
    add,
)
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def ledger() -> list[str]:
    return list(Execution.objects.order_by("id").values_list("label", flat=True))


def test_steps_run_in_order_once_each_with_retries_of_a_step():
    first = Chain(FetchData, ProcessData, NotifyUser).dispatch("order-7")

    assert Job.objects.count() == 1  # only the first step exists until it succeeds
    run_worker(concurrency=3)

    assert ledger() == ["FetchData:order-7", "ProcessData:order-7", "NotifyUser:order-7"]
    rows = list(Job.objects.order_by("chain_position"))
    assert [(r.name, r.state, r.chain_position) for r in rows] == [
        (FetchData.name, JobState.SUCCEEDED, 0),
        (ProcessData.name, JobState.SUCCEEDED, 1),
        (NotifyUser.name, JobState.SUCCEEDED, 2),
    ]
    assert {r.chain_id for r in rows} == {first.chain_id}
    assert isinstance(first.chain_id, uuid.UUID)
    assert rows[1].attempts == 3
    assert [e["message"] for e in rows[1].errors] == ["flaky attempt 1", "flaky attempt 2"]
    assert all(r.args == ["order-7"] for r in rows)


def test_a_chain_survives_a_sigkill_between_steps(spawn_worker):
    first = Chain(FetchData, SlowProcessData, NotifyUser).dispatch("order-9")
    worker = spawn_worker("--concurrency", "2")

    def second_step_on_its_good_attempt() -> bool:
        step = Job.objects.filter(name=SlowProcessData.name).first()
        return step is not None and step.state == JobState.RUNNING and step.attempts == 3

    # Step 1 done, step 2 failed twice and now sleeps in its third attempt: kill the worker.
    wait_for(second_step_on_its_good_attempt, timeout=30)
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    assert ledger() == ["FetchData:order-9"]

    replacement = spawn_worker("--concurrency", "2")
    wait_for(
        lambda: Job.objects.filter(name=NotifyUser.name, state=JobState.SUCCEEDED).exists(),
        timeout=30,
    )
    replacement.send_signal(signal.SIGTERM)
    assert replacement.wait(timeout=30) == 0, worker_output(replacement)

    assert ledger() == ["FetchData:order-9", "SlowProcessData:order-9", "NotifyUser:order-9"]
    rows = list(Job.objects.order_by("chain_position"))
    assert [(r.name, r.state, r.chain_position) for r in rows] == [
        (FetchData.name, JobState.SUCCEEDED, 0),
        (SlowProcessData.name, JobState.SUCCEEDED, 1),
        (NotifyUser.name, JobState.SUCCEEDED, 2),
    ]
    assert {r.chain_id for r in rows} == {first.chain_id}
    step = rows[1]
    assert step.attempts == 4  # two failures, the attempt lost with the worker, the success
    assert [e["class"] for e in step.errors] == [
        "ConnectionError",
        "ConnectionError",
        "django_gator.exceptions.WorkerLost",
    ]


def test_a_dead_step_stops_the_chain_and_runs_its_error_handler():
    first = Chain(FetchData, BrokenStep, NotifyUser, on_error=ChainFailed).dispatch(order="o1")

    run_worker(concurrency=2)

    broken = Job.objects.get(name=BrokenStep.name)
    assert broken.state == JobState.DEAD
    assert not Job.objects.filter(name=NotifyUser.name).exists()
    handler = Job.objects.get(name=ChainFailed.name)
    assert handler.state == JobState.SUCCEEDED
    assert handler.args == [str(first.chain_id), broken.pk]
    assert ledger() == ["FetchData:o1", f"on_error:{first.chain_id}"]


def test_chain_options_apply_to_every_step():
    Chain(FetchData, NotifyUser).dispatch("x", queue="urgent", priority=7)

    run_worker("urgent")

    assert set(Job.objects.values_list("queue", "priority", "state")) == {
        ("urgent", 7, JobState.SUCCEEDED)
    }
    assert Job.objects.count() == 2


def test_a_chain_dispatched_in_a_rolled_back_transaction_never_runs():
    def dispatch_then_fail() -> None:
        with transaction.atomic():
            Chain(FetchData, NotifyUser).dispatch("gone")
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        dispatch_then_fail()
    assert not Job.objects.exists()


def test_bad_chains_are_refused_at_dispatch():
    with pytest.raises(ValueError, match="at least one job"):
        Chain()
    with pytest.raises(TypeError, match="expected a Queueable subclass"):
        Chain(FetchData, "tests.testapp.jobs.NotifyUser")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"tests\.testapp\.jobs\.add: arguments do not fit"):
        Chain(Echo, add).dispatch("only one argument")
    assert not Job.objects.exists()
