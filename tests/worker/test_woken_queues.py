"""A wakeup for a queue that had run dry is claimed first: a new job on an idle queue does
not wait behind another queue's backlog until the weighted order puts its queue first,
while a queue with a backlog of its own keeps its weighted place."""

from __future__ import annotations

import random
import signal

import pytest
from django.db import connection

from django_gator.engines import get_engine
from django_gator.models import Job, JobState, Worker
from django_gator.worker.claims import Claimer
from django_gator.worker.queues import parse_queue_specs
from django_gator.worker.slots import Slots
from tests.conftest import learn_wakeup_targets, wait_for, worker_output
from tests.testapp.jobs import Noop, Record, Sleep
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "woken-test-worker"


class Fixed(random.Random):
    """random() is always 0.5: with weights 1000 and 1, "reports" always comes first."""

    def random(self) -> float:
        return 0.5


def claimer() -> Claimer:
    specs = parse_queue_specs(["reports,1000", "emails,1"])
    return Claimer(get_engine("default"), WORKER, specs, rng=Fixed())


def queues_of(jobs) -> list[str]:
    return [job.queue for job in jobs]


def test_the_weighted_order_alone_serves_the_heavy_queue_first():
    Noop.dispatch_many([[] for _ in range(10)], queue="reports")
    Noop.dispatch(queue="emails")
    jobs, _ = claimer().claim(4)
    assert queues_of(jobs) == ["reports"] * 4


def test_a_woken_queue_not_known_to_have_a_backlog_is_claimed_first():
    Noop.dispatch_many([[] for _ in range(10)], queue="reports")
    email = Noop.dispatch(queue="emails")
    claims = claimer()
    jobs, _ = claims.claim(4)  # reports fills the claim; emails is not read
    assert queues_of(jobs) == ["reports"] * 4
    jobs, _ = claims.claim(4, woken={"emails"})
    assert [job.id for job in jobs if job.queue == "emails"] == [email.pk]
    assert queues_of(jobs) == ["emails", "reports", "reports", "reports"]
    # The wakeup is spent: the next round is in the weighted order again.
    Noop.dispatch(queue="emails")
    jobs, _ = claims.claim(2)
    assert queues_of(jobs) == ["reports", "reports"]


def test_a_woken_queue_whose_last_claim_was_filled_keeps_its_weighted_place():
    Noop.dispatch_many([[] for _ in range(10)], queue="reports")
    Noop.dispatch_many([[] for _ in range(10)], queue="emails")
    claims = claimer()
    jobs, _ = claims.claim(2, woken={"emails"})  # not known to be busy yet: first
    assert queues_of(jobs) == ["emails", "emails"]  # and now it is: its claim was filled
    jobs, _ = claims.claim(2, woken={"emails"})
    assert queues_of(jobs) == ["reports", "reports"]


def test_a_wakeup_that_comes_while_every_slot_is_busy_waits_for_a_round_that_claims():
    slots = Slots(concurrency=1)
    slots.in_flight = 1  # the only slot is busy
    slots.notify_fetcher(notified=True, queues={"emails"})
    with slots.lock:
        busy = slots.next_round_locked()
        assert busy.free == 0
        assert busy.woken == frozenset()
        slots.in_flight = 0
        assert not slots.lingers_locked()
        free = slots.next_round_locked()
        assert free.free == 1
        assert free.woken == {"emails"}
        assert slots.next_round_locked().woken == frozenset()  # handed out once


def test_a_job_on_an_idle_queue_starts_before_another_queues_backlog_drains(spawn_worker):
    # reports,1000 / emails,1: without the wakeup's first claim, the emails job would wait
    # for nearly the whole backlog (reports comes first in 1,000 rounds of 1,001).
    backlog = 120
    Sleep.dispatch_many([[0.02] for _ in range(backlog)], queue="reports")
    proc = spawn_worker(
        "-q", "reports,1000", "-q", "emails,1", "--concurrency", "2", "--no-scheduler"
    )
    if get_engine(connection.alias).notifies:
        wait_for(lambda: Worker.objects.filter(pid=proc.pid).exists(), timeout=30)
    else:
        learn_wakeup_targets(proc)  # dispatch learns the worker's address now
    wait_for(lambda: Execution.objects.count() >= 5, timeout=30)
    email = Record.dispatch(label="email", queue="emails")
    wait_for(lambda: Execution.objects.filter(job_id=email.pk).exists(), timeout=30)
    left = Job.objects.filter(queue="reports", state=JobState.WAITING).count()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, worker_output(proc)
    # At 2 x 50 jobs a second the backlog lasts more than a second; the email job started
    # within a few claims of its dispatch.
    assert left >= backlog // 2, f"{left} of {backlog} reports jobs were still waiting"


def test_the_order_among_woken_queues_is_the_weighted_one():
    Noop.dispatch(queue="reports")
    Noop.dispatch(queue="emails")
    jobs, _ = claimer().claim(1, woken={"emails", "reports"})
    assert queues_of(jobs) == ["reports"]


def test_without_queue_specs_a_woken_queue_is_claimed_before_the_list_of_queues_knows_it():
    claims = Claimer(get_engine("default"), WORKER, rng=Fixed())
    Noop.dispatch(queue="reports")
    jobs, _ = claims.claim(2)  # reads the list of queues with work: reports
    assert queues_of(jobs) == ["reports"]
    new = Noop.dispatch(queue="brand-new")
    jobs, _ = claims.claim(2, woken={"brand-new"})  # the cached list does not have it yet
    assert [job.id for job in jobs] == [new.pk]
