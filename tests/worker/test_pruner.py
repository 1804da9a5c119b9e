"""Automatic pruning: the prune lease (one holder at a time, on every database), one pass of
the pruner, and a live worker keeping a trickle of jobs at a bounded row count."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from django_gator.engines import get_engine
from django_gator.engines.base import ClaimedJob
from django_gator.engines.flow import FlowClaims
from django_gator.engines.flow_ledger import key_scope, queue_scope
from django_gator.models import (
    Batch,
    FlowStart,
    Job,
    JobState,
    Lease,
    Queue,
    WorkflowRun,
    WorkflowStep,
)
from django_gator.testing import run_jobs
from django_gator.worker.flow import class_limits
from django_gator.worker.pruner import IDLE_MARGIN, Pruner
from django_gator.worker.supervisor import WorkerProcess
from tests.conftest import plain_table_only, start_worker_thread, wait_for, waiting_on_locks
from tests.factories import JobFactory
from tests.testapp.jobs import BatchCompleted, BatchSucceeded, Noop, RatedSpan, Record


@contextmanager
def live_worker() -> Iterator[WorkerProcess]:
    """A worker (its pruner included) running in a thread of this process until the block
    ends; then it is stopped and its thread must end."""
    worker = WorkerProcess(concurrency=2, install_signal_handlers=False)
    thread = start_worker_thread(worker)
    try:
        yield worker
    finally:
        worker.request_stop()
        thread.join(timeout=30)
    assert not thread.is_alive()


def db_now():
    return get_engine("default").db_now()


@pytest.mark.django_db(transaction=True)
def test_the_lease_has_one_holder_until_it_expires():
    now = db_now()
    assert Lease.objects.take("prune", "a", now=now, seconds=60)
    assert not Lease.objects.take("prune", "b", now=now, seconds=60)
    assert Lease.objects.take("prune", "a", now=now + timedelta(seconds=30), seconds=60)
    # a renewed until now + 90 s: b gets it only after that.
    assert not Lease.objects.take("prune", "b", now=now + timedelta(seconds=89), seconds=60)
    assert Lease.objects.take("prune", "b", now=now + timedelta(seconds=91), seconds=60)
    assert not Lease.objects.take("prune", "a", now=now + timedelta(seconds=92), seconds=60)
    assert Lease.objects.get(name="prune").holder == "b"
    # Another duty is another row.
    assert Lease.objects.take("other", "a", now=now, seconds=60)


@pytest.mark.django_db(transaction=True)
def test_racing_workers_never_both_take_the_lease():
    now = db_now()
    barrier = threading.Barrier(6)
    won: list[str] = []

    def take(holder: str) -> None:
        try:
            barrier.wait()
            if Lease.objects.take("prune", holder, now=now, seconds=60):
                won.append(holder)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=take, args=(f"w{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(won) == 1
    assert Lease.objects.get(name="prune").holder == won[0]


def finished(state: str, seconds_ago: float, count: int = 1) -> list[Job]:
    when = timezone.now() - timedelta(seconds=seconds_ago)
    trait = {state: True}
    return JobFactory.create_batch(count, finished_at=when, **trait)


@plain_table_only
@pytest.mark.django_db(transaction=True)
def test_a_pass_deletes_old_succeeded_and_cancelled_jobs_in_batches_and_nothing_else(settings):
    settings.GATOR_PRUNE_SUCCEEDED_AFTER = 3600
    settings.GATOR_PRUNE_CANCELLED_AFTER = 60
    settings.GATOR_PRUNE_BATCH_SIZE = 3
    settings.GATOR_PRUNE_PAUSE = 0
    old = finished("succeeded", 7200, 7) + finished("cancelled", 120, 2)
    kept = (
        finished("succeeded", 60, 2)  # within its retention
        + finished("cancelled", 10)
        + finished("dead", 10**6)  # dead jobs wait for an operator
        + JobFactory.create_batch(2)  # waiting
        + [JobFactory(failed=True), JobFactory(running=True)]
    )
    pruner = Pruner(get_engine("default"), "pruner-1")
    assert pruner.prune_once() == len(old)
    assert set(Job.objects.values_list("id", flat=True)) == {job.id for job in kept}
    assert pruner.prune_once() == 0
    # Another worker gets no pass while the lease is held.
    assert Pruner(get_engine("default"), "pruner-2").prune_once() is None


@pytest.mark.django_db(transaction=True)
def test_a_pass_empties_the_rate_ledger_of_the_scopes_that_went_quiet(settings):
    # The limited claim deletes a scope's rows that left its window only when it starts
    # another job of that scope: the rows of a key that went quiet stayed for ever, so the
    # ledger grew with every key ever used (found by the soak, whose accounts come and go).
    # A scope in use is left to its claims (deleting its rows on the pass's own clock let
    # a claim waiting for its queue's lock start one job too many: a soak run found that).
    settings.GATOR_PRUNE_BATCH_SIZE = 2
    settings.GATOR_PRUNE_PAUSE = 0
    Queue.objects.set_limits("spans", concurrency=None, rate_limit="3/m", by="ops")
    now = db_now()
    margin = IDLE_MARGIN

    def ledger(scope: str, *ages: float) -> list[FlowStart]:
        return [
            FlowStart.objects.create(scope=scope, started_at=now - timedelta(seconds=age))
            for age in ages
        ]

    quiet = key_scope(RatedSpan.name, "account-that-left")  # 5/s per key
    in_use = key_scope(RatedSpan.name, "account-still-here")
    gone = [
        *ledger(quiet, 1 + margin + 1, 1 + margin + 20, 1 + margin + 50),
        *ledger(queue_scope("spans"), 60 + margin + 1, 60 + margin + 600),
        *ledger("job:a.class.no.longer.limited|k", 3600 + margin + 1, 7200 + margin),
    ]
    kept = [
        *ledger(in_use, 2 * margin, 30, 0.5),  # its claims delete its old rows
        *ledger(key_scope(RatedSpan.name, "quiet-not-long-enough"), 1 + margin - 5),
        *ledger(queue_scope("other-queue-without-a-rate"), 60 + margin + 1),  # an hour
        *ledger("job:a.class.no.longer.limited|k2", 1800),  # within the longest window
    ]
    pruner = Pruner(get_engine("default"), "pruner-1")
    assert pruner.prune_once() == 0  # jobs deleted: none
    assert pruner.ledger_deleted == len(gone)
    assert set(FlowStart.objects.values_list("id", flat=True)) == {row.id for row in kept}
    assert pruner.prune_flow_starts() == 0


@pytest.mark.django_db(transaction=True)
def test_a_pass_never_deletes_a_row_a_claim_waiting_for_its_queue_lock_still_counts(settings):
    # A limited claim reads its time when its statement starts (PostgreSQL's
    # statement_timestamp()), then waits for its queue's lock, then counts the starts in its
    # window. A pass that deleted the rows just past the window on its own, later, clock
    # took starts the claim would have counted, and the claim started jobs over the limit
    # (a soak run saw 31 starts of one key within a "30/m" window).
    if connection.vendor == "sqlite":
        pytest.skip("SQLite: the pass's delete waits for the claim's write lock")
    settings.GATOR_PRUNE_PAUSE = 0
    waiting = RatedSpan.dispatch_many([["/dev/null", "k", 0] for _ in range(5)])  # 5/s per key
    Queue.objects.get_or_create(name=RatedSpan.queue)
    locked, release = threading.Event(), threading.Event()
    claimed: list[ClaimedJob] = []

    def hold_the_queue_lock() -> None:
        try:
            with transaction.atomic():
                Queue.objects.select_for_update().get(name=RatedSpan.queue)
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    def claim() -> None:
        try:
            jobs, _ = FlowClaims(get_engine("default")).claim(
                "w1", RatedSpan.queue, 5, class_limits
            )
            claimed.extend(jobs)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_the_queue_lock)
    holder.start()
    assert locked.wait(30)
    now = db_now()
    # Five starts of the key in the last second: the key is at its limit.
    starts = [now - timedelta(seconds=0.85 - 0.05 * i) for i in range(5)]
    for at in starts:
        FlowStart.objects.create(scope=key_scope(RatedSpan.name, "k"), started_at=at)
    claimer = threading.Thread(target=claim)
    claimer.start()  # its statement starts now, and waits for the lock
    wait_for(lambda: waiting_on_locks() == 1, timeout=30, interval=0.2)
    # The pass comes over a second after the first start, by its own clock.
    late = 0.35 - (db_now() - now).total_seconds()
    time.sleep(max(0.0, late))  # deliberate: the pass's clock is later than the claim's
    Pruner(get_engine("default"), "pruner-1").prune_once()
    release.set()
    holder.join(30)
    claimer.join(30)
    assert not claimer.is_alive()
    if claimed:
        claimed_at = Job.objects.get(pk=claimed[0].id).locked_at
        window = [at for at in starts if at > claimed_at - timedelta(seconds=1)]
        assert len(window) + len(claimed) <= 5, (len(window), len(claimed))
    else:
        assert all(
            job.state == JobState.WAITING
            for job in Job.objects.filter(pk__in=[j.pk for j in waiting])
        )


@plain_table_only
@pytest.mark.django_db(transaction=True)
def test_members_of_a_batch_that_has_not_completed_are_kept_until_it_completes(settings):
    # A cancelled member deleted before its batch completed let on_success run at the
    # completion, as if every member had succeeded.
    settings.GATOR_PRUNE_SUCCEEDED_AFTER = 0
    settings.GATOR_PRUNE_CANCELLED_AFTER = 0
    settings.GATOR_PRUNE_PAUSE = 0
    with Batch(on_success=BatchSucceeded, on_complete=BatchCompleted) as batch:
        cancelled = Record.dispatch("cancelled")
        Record.dispatch("ran")
        Record.dispatch("later", wait=3600)
    assert cancelled.cancel()
    run_jobs()  # "ran" succeeds; "later" is not due
    outsider = finished("succeeded", 60)[0]
    pruner = Pruner(get_engine("default"), "pruner-1")
    assert pruner.prune_once() == 1  # the job outside the batch
    assert not Job.objects.filter(pk=outsider.pk).exists()
    assert Job.objects.filter(batch_id=batch.pk).count() == 3

    run_jobs(advance=7200)  # the last member: the batch completes
    callbacks = Job.objects.filter(name__in=[BatchSucceeded.name, BatchCompleted.name])
    assert list(callbacks.values_list("name", flat=True)) == [BatchCompleted.name]
    run_jobs()
    # Completed: its members go as any finished job (and its callback, which ran).
    assert pruner.prune_once() == 4
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_auto_prune_off_prunes_nothing(settings):
    settings.GATOR_AUTO_PRUNE = False
    settings.GATOR_PRUNE_SUCCEEDED_AFTER = 0
    finished("succeeded", 3600, 3)
    assert Pruner(get_engine("default"), "pruner-1").prune_once() is None
    assert Job.objects.count() == 3


@plain_table_only
@pytest.mark.django_db(transaction=True)
def test_a_worker_keeps_a_steady_trickle_of_jobs_at_a_bounded_row_count(settings):
    settings.GATOR_PRUNE_SUCCEEDED_AFTER = 0.5
    settings.GATOR_PRUNE_INTERVAL = 0.2
    settings.GATOR_PRUNE_PAUSE = 0
    with live_worker() as worker:
        dispatched = 0
        counts = []
        # 400 jobs, four every 50 ms or so (about 70 a second, 6 s on a quiet machine; a
        # busy one dispatches more slowly). A row lives about the retention plus a pass
        # interval plus the pass, so the table holds some 60 rows at a time, and the bound
        # below (half of all dispatched) leaves room for a loaded machine's slower passes.
        deadline = time.monotonic() + 120
        while dispatched < 400 and time.monotonic() < deadline:
            for _ in range(4):
                Noop.dispatch()
                dispatched += 1
            time.sleep(0.05)  # deliberate: the trickle's pace
            counts.append(Job.objects.count())
        assert dispatched == 400
        # Rows live about retention + a pass interval: never near all of them at once.
        assert max(counts[len(counts) // 2 :]) < dispatched * 0.5, (max(counts), dispatched)
        # Once the trickle stops, everything finished is pruned.
        wait_for(lambda: Job.objects.count() == 0, timeout=30)
        pruner = worker.pruner
        assert pruner is not None
        # All by the pruner (its count is added up at the end of its pass).
        wait_for(lambda: pruner.deleted == dispatched, timeout=10)


def finished_groups() -> dict[str, object]:
    """Batches and workflows, finished or not, their jobs run; then made a day old."""
    from django_gator import Batch, Workflow
    from django_gator.testing import run_jobs
    from tests.testapp.jobs import Boom

    with Batch(description="done") as done:
        Noop.dispatch_many([[], []])
    with Batch(description="with a dead member") as dead:
        Noop.dispatch()
        Boom.dispatch()
    still_open = Batch(description="open")
    still_open.add(Noop)  # never closed: a member may still join
    wf_done = Workflow(name="done")
    wf_done.add(Noop, after=[wf_done.add_batch(Noop, [[], []])])
    wf_done.dispatch()
    wf_dead = Workflow(name="a dead step")
    wf_dead.add(Noop, after=[wf_dead.add(Boom)])
    wf_dead.dispatch()
    run_jobs(raise_errors=False)
    wf_blocked = Workflow(name="blocked")
    wf_blocked.add(Noop, after=[wf_blocked.add(Noop)])
    wf_blocked.dispatch(wait=3600)
    # A day ago: every job ended (or was dispatched), every batch completed.
    Job.objects.update(
        finished_at=timezone.now() - timedelta(days=1),
        created_at=timezone.now() - timedelta(days=1),
    )
    Batch.objects.update(
        completed_at=timezone.now() - timedelta(days=1),
        created_at=timezone.now() - timedelta(days=1),
    )
    WorkflowRun.objects.update(created_at=timezone.now() - timedelta(days=1))
    return {
        "done": done,
        "dead": dead,
        "open": still_open,
        "wf_done": wf_done.run,
        "wf_dead": wf_dead.run,
        "wf_blocked": wf_blocked.run,
    }


@plain_table_only
@pytest.mark.django_db(transaction=True)
def test_a_pass_deletes_the_batches_and_workflows_left_without_jobs(settings):
    settings.GATOR_PRUNE_SUCCEEDED_AFTER = 3600
    settings.GATOR_PRUNE_BATCH_SIZE = 1
    settings.GATOR_PRUNE_PAUSE = 0
    rows = finished_groups()
    pruner = Pruner(get_engine("default"), "pruner-1")
    pruner.prune_once()

    # Their succeeded jobs went first; then the batch and the workflow they left empty.
    assert set(Batch.objects.values_list("pk", flat=True)) == {rows["dead"].pk, rows["open"].pk}
    workflows = set(WorkflowRun.objects.values_list("pk", flat=True))
    assert workflows == {rows["wf_dead"].pk, rows["wf_blocked"].pk}
    assert not WorkflowStep.objects.filter(workflow_id=rows["wf_done"].pk).exists()
    assert pruner.deleted_batches == 2  # the batch, and the workflow's batch step's
    assert pruner.deleted_workflows == 1
    # What a retry needs stays: the dead member, its batch, the dead step, its workflow.
    dead_member = Job.objects.get(batch_id=rows["dead"].pk)
    assert dead_member.state == JobState.DEAD
    assert Job.objects.filter(chain_id=rows["wf_dead"].pk, state=JobState.DEAD).exists()

    # Once an operator prunes the dead jobs, their batch and workflow go at the next pass.
    Job.objects.filter(state=JobState.DEAD).prune()
    pruner.prune_once()
    assert set(Batch.objects.values_list("pk", flat=True)) == {rows["open"].pk}
    assert set(WorkflowRun.objects.values_list("pk", flat=True)) == {rows["wf_blocked"].pk}


@pytest.mark.django_db(transaction=True)
def test_a_batch_or_workflow_within_its_retention_is_kept(settings):
    settings.GATOR_PRUNE_SUCCEEDED_AFTER = 3600
    rows = finished_groups()
    Job.objects.all().delete()  # whatever the jobs' retention, the groups have their own
    Batch.objects.update(completed_at=timezone.now())
    WorkflowRun.objects.update(created_at=timezone.now())
    Pruner(get_engine("default"), "pruner-1").prune_once()
    assert Batch.objects.count() == 4  # two batches, the open one, a workflow's batch step
    assert WorkflowRun.objects.count() == 3
    assert rows["open"].pk in set(Batch.objects.values_list("pk", flat=True))


@plain_table_only
@pytest.mark.django_db(transaction=True)
def test_a_worker_keeps_a_trickle_of_batches_and_workflows_at_a_bounded_row_count(settings):
    """Workflows with a batch step and plain batches, dispatched steadily to a live worker
    whose pruner keeps a short retention: the rows of batches, workflows and steps stay
    bounded, and once the trickle stops every finished one is gone, while an unfinished
    workflow and an open batch stay."""
    from django_gator import Batch, Workflow

    settings.GATOR_PRUNE_SUCCEEDED_AFTER = 0.5
    settings.GATOR_PRUNE_INTERVAL = 0.2
    settings.GATOR_PRUNE_PAUSE = 0
    unfinished = Workflow(name="later")
    unfinished.add(Noop, after=[unfinished.add_batch(Noop, [[]])])
    unfinished.dispatch(wait=3600)
    still_open = Batch(description="open")
    still_open.add(Noop, wait=3600)
    with live_worker() as worker:
        rounds = 60
        counts = []
        deadline = time.monotonic() + 120
        for _ in range(rounds):
            assert time.monotonic() < deadline
            wf = Workflow(name="trickle")
            wf.add(Noop, after=[wf.add_batch(Noop, [[], [], []])])
            wf.dispatch()
            with Batch(description="trickle"):
                Noop.dispatch_many([[], []])
            time.sleep(0.05)  # deliberate: the trickle's pace
            counts.append(
                (
                    Batch.objects.count(),
                    WorkflowRun.objects.count(),
                    WorkflowStep.objects.count(),
                )
            )
        # Each lives about its jobs' retention, its own, and a pass or two: never near all.
        late = counts[len(counts) // 2 :]
        assert max(c[0] for c in late) < rounds, counts  # 2 batches a round
        assert max(c[1] for c in late) < rounds * 0.5, counts
        assert max(c[2] for c in late) < rounds, counts  # 2 steps a round
        kept_batches = {still_open.pk, unfinished.steps[0].batch.pk}
        wait_for(
            lambda: set(Batch.objects.values_list("pk", flat=True)) == kept_batches, timeout=30
        )
        wait_for(lambda: list(WorkflowRun.objects.all()) == [unfinished.run], timeout=30)
        assert WorkflowStep.objects.count() == 2
        assert worker.pruner is not None
        wait_for(lambda: worker.pruner.deleted_workflows == rounds, timeout=10)
