"""Async jobs on the worker's event loop (issue 17 item 2), and async dispatch (item 3)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from io import StringIO

import pytest
from asgiref.sync import async_to_sync
from django.core.management import CommandError, call_command
from django.test import AsyncClient

from django_gator import Queueable, job, signals
from django_gator.models import Job, JobState
from django_gator.queueable import unregister
from django_gator.testing import run_jobs
from tests.conftest import ROOT, run_worker, wait_for, worker_env, worker_output
from tests.testapp import tasks
from tests.testapp.jobs import (
    AsyncLayered,
    AsyncLeavesTransaction,
    AsyncRecord,
    AsyncSleep,
    AsyncSlowpoke,
    AsyncUntilCancelled,
    SyncLayered,
    async_add,
)
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def test_async_jobs_run_on_the_loop_many_at_once():
    """2,000 jobs of 0.2 s each with one thread and 500 async slots: about 0.8 s of
    sleeping in rounds of 500, not 400 s."""
    rows = AsyncSleep.dispatch_many([[0.2]] * 2000)

    started = time.monotonic()
    worker = run_worker("aio", concurrency=1, async_concurrency=500)
    elapsed = time.monotonic() - started

    assert worker.processed == 2000
    states = Job.objects.filter(pk__in=[r.pk for r in rows]).values_list("state", "result")
    assert {state for state, _ in states} == {JobState.SUCCEEDED}
    assert {result for _, result in states} == {"gator-aio"}  # the loop's thread
    print(f"2000 async jobs of 0.2 s drained in {elapsed:.1f} s")
    assert elapsed < 30, elapsed


def test_async_concurrency_caps_the_jobs_running_at_once():
    AsyncSleep.dispatch_many([[0.3]] * 20)

    started = time.monotonic()
    run_worker("aio", concurrency=1, async_concurrency=5)
    elapsed = time.monotonic() - started

    # 20 jobs, 5 at a time on the loop (plus at most one on the thread): 3 rounds or more.
    assert elapsed >= 0.9, elapsed


def test_an_async_job_past_its_timeout_is_cancelled_and_retried():
    row = AsyncSlowpoke.dispatch()

    run_worker("aio", concurrency=1)

    row.refresh_from_db()
    assert row.state == JobState.DEAD
    assert row.attempts == 2  # retried once, as its policy says
    assert len(row.errors) == 2
    assert (
        row.last_error
        == "django_gator.exceptions.JobTimeout: job ran longer than its timeout of 0.3 s"
    )
    # The coroutine saw the cancellation, at each attempt.
    seen = Execution.objects.filter(job_id=row.pk, label="cancelled").order_by("attempt")
    assert [e.attempt for e in seen] == [1, 2]


def test_the_async_orm_async_failures_and_function_jobs_on_the_loop():
    records = [AsyncRecord.dispatch(f"r{i}") for i in range(3)]
    added = async_add.dispatch(2, 3)

    run_worker(concurrency=1)

    for row in records:
        row.refresh_from_db()
        assert (row.state, row.result) == (JobState.SUCCEEDED, f"async {row.args[0]}")
    assert Execution.objects.filter(job_id__in=[r.pk for r in records]).count() == 3
    added.refresh_from_db()
    assert (added.state, added.result) == (JobState.SUCCEEDED, 5)


def test_middleware_sync_and_async_wraps_async_and_sync_jobs():
    a = AsyncLayered.dispatch()
    s = SyncLayered.dispatch()

    run_worker("aio", concurrency=1)

    for row, result in ((a, "layered"), (s, "sync layered")):
        row.refresh_from_db()
        assert (row.state, row.result) == (JobState.SUCCEEDED, result)
        labels = list(
            Execution.objects.filter(job_id=row.pk).order_by("id").values_list("label", flat=True)
        )
        assert labels == [
            "async-before",
            "sync-before",
            "handle",
            f"sync-after:{result}",
            "async-after",
        ]


def test_signals_are_sent_for_async_jobs():
    seen: list[tuple[str, object]] = []

    def started(sender, job, **kwargs):
        # A receiver may use the ORM: it runs in a thread, not on the loop.
        seen.append(("started", Job.objects.filter(pk=job.job_id).count()))

    def ended(sender, job, state, **kwargs):
        seen.append(("finished", state))

    signals.job_started.connect(started, sender=AsyncSleep)
    signals.job_finished.connect(ended, sender=AsyncSleep)
    try:
        AsyncSleep.dispatch(0.0)
        run_worker("aio", concurrency=1)
    finally:
        signals.job_started.disconnect(started, sender=AsyncSleep)
        signals.job_finished.disconnect(ended, sender=AsyncSleep)

    assert seen == [("started", 1), ("finished", "succeeded")]


def test_an_async_job_sees_its_cancellation(spawn_worker):
    row = AsyncUntilCancelled.dispatch()
    proc = spawn_worker("-q", "aio", "--concurrency", "1")
    wait_for(lambda: Execution.objects.filter(job_id=row.pk, label="started").exists())

    Job.objects.get(pk=row.pk).cancel()

    wait_for(lambda: Job.objects.get(pk=row.pk).state == JobState.CANCELLED, timeout=30)
    proc.terminate()
    assert proc.wait(30) == 0


def test_sigterm_lets_async_jobs_finish_and_a_forced_stop_gives_them_back(spawn_worker):
    quick = AsyncSleep.dispatch_many([[1.0]] * 5)
    slow = AsyncSleep.dispatch_many([[60.0]] * 5)
    proc = spawn_worker("-q", "aio", "--concurrency", "1", "--shutdown-timeout", "3")
    ids = [r.pk for r in quick + slow]
    wait_for(lambda: Job.objects.filter(pk__in=ids, state=JobState.RUNNING).count() == 10)

    proc.send_signal(signal.SIGTERM)

    assert proc.wait(30) == 0, worker_output(proc)
    # The quick ones finished within the shutdown timeout; the slow ones were cancelled
    # and given back, their attempt not charged.
    done = Job.objects.filter(pk__in=[r.pk for r in quick])
    assert {j.state for j in done} == {JobState.SUCCEEDED}
    back = Job.objects.filter(pk__in=[r.pk for r in slow])
    assert {(j.state, j.attempts) for j in back} == {(JobState.WAITING, 0)}


def test_a_transaction_left_open_on_the_orm_thread_is_rolled_back_and_fails_the_job():
    # Together on the loop: the job whose call left the transaction is blamed, and the
    # stray transaction is gone before the other job's calls use the connection.
    row = AsyncLeavesTransaction.dispatch()
    after = AsyncRecord.dispatch("after", 0.1)

    run_worker(concurrency=1)

    row.refresh_from_db()
    assert row.state == JobState.DEAD
    assert row.last_error.startswith("django_gator.exceptions.TransactionLeftOpen:")
    assert not Execution.objects.filter(label="lost").exists()
    after.refresh_from_db()
    assert after.state == JobState.SUCCEEDED
    assert Execution.objects.filter(job_id=after.pk).exists()


def test_atomic_is_refused_on_an_async_job_naming_the_class():
    with pytest.raises(TypeError, match=r"AtomicAsync is an async job .* atomic = True"):

        class AtomicAsync(Queueable):
            atomic = True

            async def handle(self) -> None:
                pass

    with pytest.raises(TypeError, match=r"atomic_async is an async job"):

        @job(atomic=True)
        async def atomic_async() -> None:
            pass

    unregister(f"{__name__}.AtomicAsync")
    unregister(f"{__name__}.atomic_async")


def test_async_jobs_run_under_run_jobs_and_immediate(settings):
    row = AsyncSleep.dispatch(0.0)
    run_jobs()
    row.refresh_from_db()
    assert row.state == JobState.SUCCEEDED

    settings.GATOR_IMMEDIATE = True
    added = async_to_sync(async_add.adispatch)(20, 22)
    added.refresh_from_db()
    assert (added.state, added.result) == (JobState.SUCCEEDED, 42)


def test_async_tasks_run_on_the_loop():
    result = async_to_sync(tasks.async_multiply.aenqueue)(6, 7)

    run_worker(concurrency=1)

    assert async_to_sync(tasks.async_multiply.aget_result)(result.id).return_value == 42


# -- async dispatch ------------------------------------------------------------------------


def test_adispatch_validates_as_dispatch_does_before_any_insert():
    for call in (
        lambda: AsyncSleep.dispatch(1, 2, 3),
        lambda: async_to_sync(AsyncSleep.adispatch)(1, 2, 3),
    ):
        with pytest.raises(TypeError, match=r"arguments do not fit handle\(\)"):
            call()
    with pytest.raises(TypeError, match="dispatch_many\\(\\) item 1"):
        async_to_sync(async_add.adispatch_many)([[1, 2], {"c": 3}])
    with pytest.raises(ValueError, match="priority"):
        async_to_sync(AsyncSleep.adispatch)(0.0, priority=1000)
    assert not Job.objects.exists()


def test_a_workflow_adispatches_after_checking_its_graph_on_the_loop():
    from django_gator import Workflow
    from django_gator.models import WorkflowRun

    bad = Workflow("cycle")
    a = bad.add(AsyncSleep, 0.0)
    b = bad.add(AsyncSleep, 0.0, after=[a])
    a.depends_on(b)
    with pytest.raises(ValueError, match="has a cycle"):
        async_to_sync(bad.adispatch)()
    assert not Job.objects.exists()
    assert not WorkflowRun.objects.exists()

    wf = Workflow("async")
    first = wf.add(AsyncSleep, 0.0)
    wf.add(async_add, 1, 2, after=[first])
    run = async_to_sync(wf.adispatch)()

    assert first.job is not None
    assert Job.objects.get().pk == first.job.pk  # the second step waits for the first
    run_jobs()
    assert Job.objects.filter(chain_id=run.id, state=JobState.SUCCEEDED).count() == 2


def test_adispatch_in_an_async_view():
    response = async_to_sync(AsyncClient().get)("/async/dispatch/")

    assert response.status_code == 200
    ids = response.json()["ids"]
    assert len(ids) == 4
    assert None not in ids
    assert Job.objects.filter(pk__in=ids, state=JobState.WAITING).count() == 4
    assert Job.objects.get(pk=ids[3]).chain_id is not None


@pytest.mark.parametrize("on_commit", [False, True])
@pytest.mark.parametrize("rollback", [False, True])
def test_adispatch_in_an_async_view_inside_a_transaction(on_commit, rollback):
    query = f"?rollback={int(rollback)}&on_commit={int(on_commit)}"
    response = async_to_sync(AsyncClient().get)("/async/dispatch-in-transaction/" + query)

    assert response.status_code == 200
    seen = response.json()
    if on_commit:
        # The INSERT waits for the commit of the view's transaction.
        assert (seen["id_inside"], seen["rows_inside"]) == (None, 0)
    else:
        # It joined the transaction, on the connection of the thread that opened it.
        assert seen["id_inside"] is not None
        assert seen["rows_inside"] == 1
    rows = Job.objects.filter(name=AsyncSleep.name)
    if rollback:
        assert not rows.exists()
        assert not Execution.objects.filter(label="view").exists()
    else:
        assert rows.count() == 1
        assert seen["id_after"] == rows.get().pk


# -- bad input -----------------------------------------------------------------------------


def test_async_concurrency_0_is_refused_naming_the_value():
    with pytest.raises(
        CommandError, match="argument --async-concurrency: must be at least 1, got 0"
    ):
        call_command("gator_worker", "--async-concurrency", "0", "--help", stdout=StringIO())
    proc = subprocess.run(
        [sys.executable, "-m", "django", "gator_worker", "--async-concurrency", "0"],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--async-concurrency: must be at least 1, got 0" in proc.stderr
