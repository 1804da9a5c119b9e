"""Claiming ahead (worker/ahead.py): while jobs run for less time than a claim takes, a
worker claims for its slots before they free up; never while a job runs longer."""

from __future__ import annotations

import threading
import time

import pytest

from django_gator.models import Job, JobState
from django_gator.worker.ahead import ClaimAhead
from django_gator.worker.entries import Running
from django_gator.worker.queues import parse_queue_specs
from django_gator.worker.slots import Slots
from django_gator.worker.supervisor import WorkerProcess
from tests.conftest import start_worker_thread, wait_for
from tests.factories import claimed_job
from tests.testapp.jobs import Noop, Record
from tests.testapp.models import Execution


def entry(started: float) -> Running:
    return Running(claimed_job(1, name="n"), threading.current_thread(), None, started)


def test_the_allowance_is_the_concurrency_only_while_jobs_are_shorter_than_a_claim():
    ahead = ClaimAhead(4)
    now = time.monotonic()
    assert ahead.allowance([], now) == 0  # no claim measured yet
    ahead.window = 0.002
    assert ahead.allowance([], now) == 0  # no job measured yet
    ahead.ran(0.0005)
    assert ahead.allowance([entry(now - 0.001)], now) == 4
    assert ahead.allowance([entry(now - 0.001), entry(now - 0.01)], now) == 0, (
        "a job running longer than a claim: its slot is not about to free"
    )
    for _ in range(20):
        ahead.ran(0.01)  # the jobs got longer than a claim
    assert ahead.allowance([], now) == 0


def test_slots_claim_ahead_for_short_jobs():
    slots = Slots(concurrency=2)
    slots.ahead.window = 0.05
    slots.ahead.ran(0.0001)
    with slots.lock:
        assert slots.next_round_locked().free == 4
        slots.hand_out_locked([claimed_job(i, name="n") for i in range(1, 5)])
        assert slots.next_round_locked().free == 0
    me = threading.current_thread()
    assert slots.next_job(me, lambda j: None) is not None
    with slots.lock:
        assert slots.next_round_locked().free == 0  # still 4 in flight
        slots.running[me].started -= 1.0  # the running job turns out long
        slots.in_flight -= 1
        assert slots.next_round_locked().free == 0, "no claim ahead behind a long job"


@pytest.mark.django_db(transaction=True)
def test_a_long_job_stops_claims_ahead_of_its_slot():
    # Short jobs first (the worker measures them shorter than a claim and claims ahead),
    # then one that runs for 1.5 s, then more short ones. While the long one runs, the
    # worker (one thread) holds at most the one job it may have claimed ahead before the
    # long one started, and claims no more.
    Noop.dispatch_many([[i] for i in range(40)], queue="ahead")
    long_job = Record.dispatch("long", sleep=1.5, queue="ahead")
    Noop.dispatch_many([[i] for i in range(40, 50)], queue="ahead")
    worker = WorkerProcess(
        parse_queue_specs(["ahead"]), concurrency=1, burst=True, install_signal_handlers=False
    )
    thread = start_worker_thread(worker)
    try:
        wait_for(lambda: Job.objects.get(pk=long_job.pk).state == JobState.RUNNING, 30)
        time.sleep(0.3)  # deliberate: the long job runs longer than any claim
        early = Job.objects.filter(queue="ahead", state=JobState.RUNNING).count()
        time.sleep(0.6)  # deliberate: the fetcher had time to claim, had it wanted to
        late = Job.objects.filter(queue="ahead", state=JobState.RUNNING).count()
        assert 1 <= early <= 2, early
        assert late == early, "claimed more while a long job held the only thread"
        thread.join(timeout=60)
        assert not thread.is_alive()
    finally:
        worker.request_stop()
        thread.join(timeout=30)
    assert Job.objects.filter(queue="ahead", state=JobState.SUCCEEDED).count() == 51
    assert list(Execution.objects.values_list("label", flat=True)) == ["long"]
