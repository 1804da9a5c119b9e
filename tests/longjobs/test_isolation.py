"""Process isolation (issue 35): an isolated attempt runs in a child process; a segfault,
an os._exit() or a memory limit fails that attempt alone, with an error that says what
happened, while the worker and its other jobs go on; progress, checkpoints, logs and
results cross the process boundary."""

from __future__ import annotations

import os

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_gator import Queueable
from django_gator.models import Job, JobState
from django_gator.worker.queues import QueueSpec
from django_gator.worker.supervisor import WorkerProcess
from tests.conftest import run_worker, start_worker_thread, wait_for
from tests.testapp.isolated_jobs import (
    AsyncIsolated,
    EatsMemory,
    ExitsThree,
    HangsInC,
    IsolatedSlowItems,
    IsolatedStalls,
    IsolatedWork,
    Ordinary,
    RaisesOddError,
    Segfaults,
    SpinsForever,
)
from tests.testapp.models import ItemDone

pytestmark = pytest.mark.django_db(transaction=True)

DIED = "django_gator.exceptions.IsolatedProcessDied"


def test_a_segfault_an_exit_and_a_memory_limit_fail_alone_while_fifty_jobs_succeed():
    segfault = Segfaults.dispatch()
    exits = ExitsThree.dispatch()
    eats = EatsMemory.dispatch(400)
    ordinary = [Ordinary.dispatch(n) for n in range(50)]
    worker = run_worker("isolated", concurrency=4)

    segfault.refresh_from_db()
    assert segfault.state == JobState.DEAD  # no retry policy
    assert segfault.error_class == DIED
    assert "killed by signal 11 (SIGSEGV)" in segfault.last_error
    assert "native code" in segfault.last_error

    exits.refresh_from_db()
    assert exits.state == JobState.SUCCEEDED  # retried by its policy
    assert exits.attempts == 2
    assert [e["class"] for e in exits.errors] == [DIED]
    assert "exited with code 3" in exits.errors[0]["message"]
    assert exits.result != os.getpid()

    eats.refresh_from_db()
    assert eats.state == JobState.DEAD
    assert eats.error_class == "django_gator.exceptions.MemoryLimitExceeded"
    assert "memory_limit of 128 MiB" in eats.last_error

    for job in ordinary:
        job.refresh_from_db()
        assert job.state == JobState.SUCCEEDED, job.last_error
        assert job.result == os.getpid()  # in the worker's own threads
    # No rescue, no lost worker: the worker wrote every failure itself, and never
    # replaced an executor thread.
    assert Job.objects.filter(rescues__gt=0).count() == 0
    assert worker.executors.started == 4
    assert worker.slots.processed == 50 + 4  # every attempt, the retry included


def test_progress_checkpoints_logs_and_the_result_cross_the_process_boundary():
    job = IsolatedWork.dispatch(8, fail_at=5)
    run_worker("isolated", concurrency=1)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED, job.last_error
    # The retry resumed at the failed item, from the checkpoint the first child wrote.
    assert job.result["start"] == 5
    assert job.checkpoint_data == {"each": 8}
    assert job.progress["done"] == 8
    assert job.progress["total"] == 8
    ledger = list(ItemDone.objects.filter(job_id=job.pk).values_list("item", "attempt", "pid"))
    assert sorted(i for i, _, _ in ledger) == list(range(8))  # none twice, none missed
    pids = {a: p for _, a, p in ledger}
    assert os.getpid() not in pids.values()
    assert pids[1] != pids[2]  # one child per attempt
    assert job.result["pid"] == pids[2]
    first, second = job.logs()
    assert [line.split(": ", 1)[1] for line in first["lines"]] == [
        f"item {i} in pid {pids[1]}" for i in range(5)
    ]
    assert (second["attempt"], len(second["lines"])) == (2, 3)
    assert job.errors[0]["message"] == "failing at 5"
    assert "RuntimeError" in job.errors[0]["class"]
    assert 'raise RuntimeError(f"failing at {item}")' in job.errors[0]["traceback"]


def test_an_error_that_cannot_be_unpickled_is_recorded_as_the_child_saw_it():
    job = RaisesOddError.dispatch()
    run_worker("isolated", concurrency=1)
    job.refresh_from_db()
    assert job.state == JobState.DEAD
    assert job.error_class == "tests.testapp.isolated_jobs.OddError"
    assert job.last_error.endswith("OddError: 1+2")
    assert "raise OddError(1, 2)" in job.errors[0]["traceback"]


def test_an_isolated_async_job_is_awaited_in_its_child():
    job = AsyncIsolated.dispatch(21)
    run_worker("isolated", concurrency=1)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED, job.last_error
    assert job.result["value"] == 42
    assert job.result["pid"] != os.getpid()
    assert job.progress["note"] == "async child"


def test_a_timeout_kills_a_child_stuck_in_a_call_that_never_returns():
    job = HangsInC.dispatch()
    worker = run_worker("isolated", concurrency=1)
    job.refresh_from_db()
    assert job.state == JobState.DEAD
    assert job.error_class == "django_gator.exceptions.JobTimeout"
    (pid,) = ItemDone.objects.filter(job_id=job.pk).values_list("pid", flat=True)
    assert pid != os.getpid()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped
    assert worker.executors.started == 2  # its thread replaced, as for any timeout


def test_a_stalled_child_is_killed_and_its_job_retried():
    job = IsolatedStalls.dispatch()
    run_worker("isolated", concurrency=1)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED, job.last_error
    assert job.result == 2
    assert [e["class"] for e in job.errors] == ["django_gator.exceptions.JobStalled"]


@override_settings(GATOR_PROGRESS_INTERVAL=0.1)
def test_an_isolated_job_in_each_is_handed_back_at_its_cursor_when_its_worker_stops():
    job = IsolatedSlowItems.dispatch(500, 0.02)
    worker = WorkerProcess(
        [QueueSpec("isolated")],
        concurrency=1,
        install_signal_handlers=False,
        shutdown_timeout=120,  # only the hand-back lets it stop at once
    )
    thread = start_worker_thread(worker)
    wait_for(lambda: (Job.objects.get(pk=job.pk).progress or {}).get("done", 0) >= 5)
    worker.request_stop()
    thread.join(30)
    assert not thread.is_alive()
    row = Job.objects.get(pk=job.pk)
    assert row.state == JobState.WAITING
    assert row.handbacks == 1
    saved = row.checkpoint_data["each"]
    assert 5 <= saved < 500


def test_a_queue_given_to_isolate_queue_runs_every_job_in_a_child():
    job = Ordinary.dispatch(1)
    worker = WorkerProcess(
        [QueueSpec("isolated", isolated=True)],
        concurrency=1,
        burst=True,
        install_signal_handlers=False,
    )
    worker.run()
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED, job.last_error
    assert job.result != os.getpid()


def test_isolate_queue_must_name_one_of_the_workers_queues():
    with pytest.raises(CommandError, match="'bulk' is not one of this worker's queues"):
        call_command("gator_worker", "--burst", "-q", "isolated", "--isolate-queue", "bulk")


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"isolation": "fork"}, 'isolation must be "thread" or "process", not \'fork\''),
        ({"memory_limit": 0}, "memory_limit must be None or a whole number of MiB, not 0"),
        ({"memory_limit": "1G"}, "memory_limit must be None or a whole number of MiB, not '1G'"),
        ({"isolation": "process", "atomic": True}, "an atomic job cannot have isolation"),
    ],
)
def test_bad_isolation_settings_are_refused_when_the_class_is_defined(attributes, message):
    with pytest.raises(ValueError, match="Bad") as info:
        type("Bad", (Queueable,), {**attributes, "__module__": __name__, "handle": lambda s: 0})
    assert message in str(info.value)


def test_a_cpu_limit_ends_an_isolated_attempt_that_spins_while_others_succeed():
    spins = SpinsForever.dispatch()
    ordinary = [Ordinary.dispatch(n) for n in range(10)]
    run_worker("isolated", concurrency=2)

    spins.refresh_from_db()
    assert spins.state == JobState.DEAD  # no retry policy
    assert spins.error_class == DIED
    assert "SIGXCPU" in spins.last_error
    assert "cpu_limit of 1 s" in spins.last_error
    for job in ordinary:
        job.refresh_from_db()
        assert job.state == JobState.SUCCEEDED, job.last_error
    assert Job.objects.filter(rescues__gt=0).count() == 0


def test_limits_must_be_whole_numbers():
    for attribute, bad in (("cpu_limit", 0.5), ("cpu_limit", True), ("memory_limit", -1)):
        with pytest.raises(ValueError, match=rf"\.{attribute} must be None or a whole number"):
            type("Bad", (Queueable,), {"handle": lambda self: None, attribute: bad})


def test_an_alias_the_worker_added_at_run_time_reaches_the_child(monkeypatch):
    # The fork server set Django up from the settings as they were when it started; an
    # alias added to DATABASES since (here as a test adds one) used to kill every child.
    import copy

    from django.conf import settings as django_settings
    from django.db import connections

    monkeypatch.setitem(
        django_settings.DATABASES, "late_alias", copy.deepcopy(django_settings.DATABASES["default"])
    )
    try:
        job = IsolatedWork.dispatch(2)
        run_worker("isolated", concurrency=1)
        job.refresh_from_db()
        assert job.state == JobState.SUCCEEDED, job.last_error
    finally:
        connections["late_alias"].close()
        del connections["late_alias"]
