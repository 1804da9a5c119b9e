"""Automatic pruning: the prune lease (one holder at a time, on every database), one pass of
the pruner, and a live worker keeping a trickle of jobs at a bounded row count."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from django_gator import Batch
from django_gator.engines import get_engine
from django_gator.engines.base import ClaimedJob
from django_gator.engines.flow import FlowClaims, key_scope, queue_scope
from django_gator.models import FlowStart, Job, JobState, Lease, Queue
from django_gator.testing import run_jobs
from django_gator.worker.flow import class_limits
from django_gator.worker.pruner import IDLE_MARGIN, Pruner
from django_gator.worker.supervisor import WorkerProcess
from tests.conftest import wait_for
from tests.factories import JobFactory
from tests.testapp.jobs import BatchCompleted, BatchSucceeded, Noop, RatedSpan, Record


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
    time.sleep(0.35)
    Pruner(get_engine("default"), "pruner-1").prune_once()  # a second after the first start
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


@pytest.mark.django_db(transaction=True)
def test_a_worker_keeps_a_steady_trickle_of_jobs_at_a_bounded_row_count(settings):
    settings.GATOR_PRUNE_SUCCEEDED_AFTER = 0.5
    settings.GATOR_PRUNE_INTERVAL = 0.2
    settings.GATOR_PRUNE_PAUSE = 0
    worker = WorkerProcess(concurrency=2, install_signal_handlers=False)

    def run() -> None:
        try:
            worker.run()
        finally:
            connections.close_all()  # this thread's own (registering the worker)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        dispatched = 0
        counts = []
        # 300 jobs, five every 20 ms or so: about 6 s on a quiet machine (a busy one takes
        # longer, and the bound below is relative to what was dispatched).
        deadline = time.monotonic() + 120
        while dispatched < 300 and time.monotonic() < deadline:
            for _ in range(5):
                Noop.dispatch()
                dispatched += 1
            time.sleep(0.02)
            counts.append(Job.objects.count())
        assert dispatched == 300
        # Rows live about retention + a pass interval: never near all of them at once.
        assert max(counts[len(counts) // 2 :]) < dispatched * 0.5, (max(counts), dispatched)
        # Once the trickle stops, everything finished is pruned.
        wait_for(lambda: Job.objects.count() == 0, timeout=30)
        pruner = worker.pruner
        assert pruner is not None
        # All by the pruner (its count is added up at the end of its pass).
        wait_for(lambda: pruner.deleted == dispatched, timeout=10)
    finally:
        worker.request_stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
