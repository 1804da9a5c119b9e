"""Jobs are user code, and user code misbehaves: async handlers, odd exceptions, stray
transactions, session changes, stray threads. Whatever a job does, its attempt is recorded
as what it was, the next job on the same thread starts from a clean connection, and a
stopped worker exits. Real workers, real databases."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from django.db import connection

from django_gator.attempts import Failure
from django_gator.engines import get_engine
from django_gator.models import Job, JobState
from django_gator.worker.supervisor import WorkerProcess
from tests.conftest import run_worker, wait_for, worker_output
from tests.testapp.jobs import (
    AsyncBoom,
    AsyncRecord,
    LeavesAtomicOpen,
    LeavesTransactionOpen,
    RaisesOdd,
    Record,
    SetsReadOnlySession,
    StartsThread,
    async_record,
)
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


# -- async handlers ------------------------------------------------------------------------


def test_async_handle_runs_its_body_before_the_job_is_marked_succeeded():
    jobs = [AsyncRecord.dispatch(f"a{i}") for i in range(3)]
    func = async_record.dispatch("from @job")

    run_worker(concurrency=2)

    for row in jobs:
        row.refresh_from_db()
        assert row.state == JobState.SUCCEEDED
        assert Execution.objects.filter(job_id=row.pk, attempt=1).count() == 1
    assert [j.result for j in jobs] == ["async a0", "async a1", "async a2"]
    func.refresh_from_db()
    assert func.state == JobState.SUCCEEDED
    assert func.result == "from @job"
    assert Execution.objects.filter(label="from @job").count() == 1


def test_an_async_handler_that_raises_fails_like_a_sync_one():
    row = AsyncBoom.dispatch("async failure")

    run_worker()

    row.refresh_from_db()
    assert row.state == JobState.DEAD
    assert row.last_error == "ValueError: async failure"


# -- odd exceptions --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "summary", "note"),
    [
        ("nul", "ValueError: before\\x00after", "escaped"),
        ("unprintable", "UnprintableError: <str() of the exception raised", "__str__ raised"),
        ("surrogate", "ValueError: lone \\udc80 surrogate", "escaped"),
        ("huge", "ValueError: xxxxxxxx", None),
        ("base", "BaseBoom: not an Exception", None),
    ],
)
def test_whatever_a_job_raises_is_recorded_and_the_worker_goes_on(kind, summary, note):
    odd = RaisesOdd.dispatch(kind)
    after = Record.dispatch("after the odd one")

    worker = run_worker(concurrency=1)

    odd.refresh_from_db()
    assert odd.state == JobState.DEAD, odd.last_error
    assert odd.last_error.startswith(summary.replace("tests.testapp.jobs.", "")) or (
        summary in odd.last_error
    ), odd.last_error
    [entry] = odd.errors
    assert entry["attempt"] == 1
    if note:
        assert note in entry["note"]
    else:
        assert "note" not in entry
    if kind == "unprintable":
        assert "the real message" in entry["message"]
    if kind == "huge":
        assert len(entry["message"]) <= 4000
    assert Job.objects.get(pk=after.pk).state == JobState.SUCCEEDED
    assert worker.processed == 2


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_an_entry_the_database_refuses_is_recorded_in_a_form_it_accepts():
    """A permanent error writing a failure (here: an error entry that is not JSON, which
    jsonb refuses) is not retried forever: the failure is written with an entry saying
    what could not be stored."""
    row = Record.dispatch("refused")
    worker = WorkerProcess(concurrency=1, burst=True, install_signal_handlers=False)
    engine = get_engine(worker.alias)
    engine.register_worker(worker.worker_id, "test", 1, "[]", 1)
    [claimed] = engine.claim(worker.worker_id, "default", 1)
    broken = Failure(
        dead=True, retry_in=None, queue="default", error="{not json", last_error="Boom: x\x00"
    )

    worker.outcomes.record(claimed, broken, 1.0, batch=False)

    row.refresh_from_db()
    assert row.state == JobState.DEAD
    assert row.last_error.startswith("django_gator.worker.execution.UnstorableError: ")
    assert "Boom: x\\x00" in row.last_error
    assert row.errors[-1]["class"] == "django_gator.worker.execution.UnstorableError"


# -- stray transactions and session changes --------------------------------------------------


@pytest.mark.parametrize("job_class", [LeavesTransactionOpen, LeavesAtomicOpen])
def test_a_transaction_left_open_fails_its_job_and_loses_no_later_jobs_writes(job_class):
    stray = job_class.dispatch("stray")
    later = Record.dispatch_many([[f"later {i}"] for i in range(5)])

    worker = run_worker(concurrency=1)

    stray.refresh_from_db()
    assert stray.state == JobState.DEAD
    assert stray.last_error.startswith("django_gator.exceptions.TransactionLeftOpen: ")
    assert "rolled back" in stray.last_error
    # Its own uncommitted write is gone; every later job's write is there, committed.
    assert not Execution.objects.filter(label="stray").exists()
    for row in later:
        row.refresh_from_db()
        assert row.state == JobState.SUCCEEDED
        assert Execution.objects.filter(job_id=row.pk).count() == 1
    assert worker.processed == 6


def test_a_session_setting_does_not_outlive_its_job():
    changer = SetsReadOnlySession.dispatch()
    later = Record.dispatch_many([[f"after read-only {i}"] for i in range(3)])

    run_worker(concurrency=1)

    assert Job.objects.get(pk=changer.pk).state == JobState.SUCCEEDED
    for row in later:
        row.refresh_from_db()
        assert row.state == JobState.SUCCEEDED, row.last_error
        assert Execution.objects.filter(job_id=row.pk).count() == 1


def test_a_transaction_left_open_does_not_block_a_second_connection():
    """On SQLite a stray transaction holds the write lock: with it rolled back, another
    connection (a web process) writes at once."""
    LeavesTransactionOpen.dispatch("stray")

    run_worker(concurrency=1)

    started = time.monotonic()
    Execution.objects.create(job_id=-1, attempt=1, pid=1, label="web write")
    assert time.monotonic() - started < 2


# -- stray threads ---------------------------------------------------------------------------


def test_a_stopped_worker_exits_although_a_job_left_a_thread_running(spawn_worker):
    StartsThread.dispatch(600)
    proc = spawn_worker("--concurrency", "1", env={"GATOR_LOG_LEVEL": "INFO"})
    wait_for(lambda: Job.objects.filter(state=JobState.SUCCEEDED).exists(), timeout=30)

    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"still running 20 s after SIGTERM:\n{worker_output(proc)}") from None

    output = worker_output(proc)
    assert code == 0, output
    assert "Worker stopped" in output
    assert "threads=job-stray" in output


def test_error_entries_are_json_with_the_escaped_text():
    row = RaisesOdd.dispatch("nul")

    run_worker()

    with connection.cursor() as cursor:
        cursor.execute("SELECT errors FROM django_gator_job WHERE id = %s", [row.pk])
        raw = cursor.fetchone()[0]
    entries = json.loads(raw) if isinstance(raw, str) else raw
    assert entries[0]["message"] == "before\\x00after"
