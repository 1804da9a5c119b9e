"""The fetcher, and the executors with their watchdog, used alone: real database, real
claims, no supervisor, no signals, no heartbeat."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from django.db import connections

from django_gator.engines import get_engine
from django_gator.exceptions import JobTimeout
from django_gator.models import Job, JobState
from django_gator.worker.claims import Claimer
from django_gator.worker.executor import Executors
from django_gator.worker.fetcher import Fetcher
from django_gator.worker.outcomes import Outcomes
from django_gator.worker.slots import Slots
from tests.factories import claimed_job
from tests.testapp.jobs import Boom, Echo, TooSlow

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "fetcher-test"


class Parts:
    """A worker's components, wired as the supervisor wires them, with no threads: the
    executors' ``spawn`` only records what would have been started."""

    def __init__(self, concurrency: int = 2, *, burst: bool = False) -> None:
        self.engine = get_engine("default")
        self.engine.register_worker(WORKER, "h", 1, "[]", concurrency)
        self.slots = Slots(concurrency)
        self.outcomes = Outcomes(self.engine, WORKER)
        self.spawned: list[str] = []
        self.executors = Executors(self.slots, self.outcomes, self.engine, self._spawn)
        self.drained = threading.Event()
        self.fetcher = Fetcher(
            engine=self.engine,
            slots=self.slots,
            claimer=Claimer(self.engine, WORKER),
            executors=self.executors,
            outcomes=self.outcomes,
            retrying=lambda what, action: action(),
            stopped=threading.Event(),
            poll_interval=0.05,
            burst=burst,
            on_drained=self.drained.set,
        )

    def _spawn(self, name: str, target: Callable[[], None]) -> threading.Thread:
        self.spawned.append(name)
        return threading.current_thread()


def test_after_a_lost_claim_answer_only_the_jobs_no_thread_holds_go_back():
    parts = Parts()
    Echo.dispatch_many([["held"], ["orphan"]])
    held, orphan = parts.engine.claim(WORKER, "echo", 2)  # the orphan's answer was "lost"
    with parts.slots.lock:
        parts.slots.hand_out_locked([held])

    parts.fetcher.release_orphans([])

    rows = {job.pk: job for job in Job.objects.all()}
    assert rows[held.id].state == JobState.RUNNING
    assert (rows[orphan.id].state, rows[orphan.id].attempts) == (JobState.WAITING, 0)


def test_a_suspect_is_marked_isolated_before_an_executor_gets_it():
    parts = Parts()
    row = Echo.dispatch("suspect")
    Job.objects.filter(pk=row.pk).update(suspect=True)
    [suspect] = parts.engine.claim(WORKER, "echo", 1)
    assert suspect.suspect
    with parts.slots.lock:
        parts.slots.hand_out_locked([suspect])
        turn = parts.slots.next_round_locked()
    assert turn.suspect is suspect  # nothing else here: it may start

    parts.fetcher.start_isolated(suspect)

    assert Job.objects.get(pk=row.pk).isolated
    assert parts.slots.isolated is suspect
    assert list(parts.slots.pending) == [suspect]


def test_a_burst_fetcher_claims_hands_out_and_stops_when_nothing_is_left():
    parts = Parts(concurrency=2, burst=True)
    rows = Echo.dispatch_many([["a"], ["b"]])

    def fetch() -> None:
        try:
            parts.fetcher.run()
        finally:
            connections.close_all()  # this thread's, as the supervisor's threads do

    runner = threading.Thread(target=fetch, daemon=True)
    runner.start()
    me = threading.current_thread()
    for _ in rows:  # this thread plays the executor
        job = parts.slots.next_job(me, lambda j: None)
        assert job is not None
        parts.slots.finish(me, parts.executors.execute(job))
    assert parts.drained.wait(10)
    runner.join(10)
    states = set(Job.objects.values_list("state", flat=True))
    assert states == {JobState.SUCCEEDED}  # the batched marks were written on the way


def test_an_executor_writes_a_failure_at_once():
    parts = Parts()
    row = Boom.dispatch("no")
    [job] = parts.engine.claim(WORKER, row.queue, 1)
    with parts.slots.lock:
        parts.slots.hand_out_locked([job])
    parts.slots.next_job(threading.current_thread(), lambda j: None)

    parts.executors.execute(job)

    row.refresh_from_db()
    assert row.state == JobState.DEAD
    assert row.last_error == "RuntimeError: no"


def test_the_watchdog_fails_a_job_past_its_deadline_and_replaces_its_thread():
    parts = Parts(concurrency=1)
    row = TooSlow.dispatch(30)
    [job] = parts.engine.claim(WORKER, row.queue, 1)
    with parts.slots.lock:
        parts.slots.hand_out_locked([job])
    stuck = threading.Thread(target=time.sleep, args=(0,))  # stands for the executor
    parts.slots.next_job(stuck, lambda j: time.monotonic() - 1)  # already past due

    parts.executors.write_timeouts()

    assert parts.spawned == ["gator-executor-1"]  # a fresh thread for the slot
    assert stuck in parts.slots.retired
    row.refresh_from_db()
    assert row.state in (JobState.FAILED, JobState.DEAD)
    assert row.last_error.startswith(f"{JobTimeout.__module__}.JobTimeout: ")


def test_a_claim_for_short_jobs_waits_for_the_slots_still_running(monkeypatch):
    """While the jobs run for less time than a claim takes, a claim for a freed slot waits
    (up to MAX_LINGER) for the other slots, so that one claim serves them all; a stop or a
    NOTIFY ends the wait, and jobs longer than a claim are not waited for."""
    from django_gator.worker import fetcher as fetcher_module

    monkeypatch.setattr(fetcher_module, "MAX_LINGER", 30.0)
    parts = Parts(concurrency=2)
    fetcher, slots = parts.fetcher, parts.slots
    fetcher.claim_seconds, fetcher.job_seconds = 30.0, 0.001
    me = threading.current_thread()

    def linger() -> threading.Thread:
        def run() -> None:
            with slots.lock:
                fetcher.linger_locked()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    with slots.lock:
        slots.hand_out_locked([claimed_job(1), claimed_job(2)])
    slots.next_job(me, lambda j: None)
    slots.finish(me, None)  # one slot free, the other still running

    waiting = linger()
    waiting.join(0.3)
    assert waiting.is_alive()  # waits for the running job
    slots.next_job(me, lambda j: None)
    slots.finish(me, None)
    waiting.join(10)
    assert not waiting.is_alive()  # ... and claims as soon as its slot is free too

    for end in (lambda: slots.notify_fetcher(notified=True), lambda: slots.stop()):
        slots.notified = slots.stopping = False
        with slots.lock:
            slots.hand_out_locked([claimed_job(3), claimed_job(4)])
        slots.next_job(me, lambda j: None)
        slots.finish(me, None)
        waiting = linger()
        waiting.join(0.3)
        assert waiting.is_alive()
        end()
        waiting.join(10)
        assert not waiting.is_alive()
        slots.next_job(me, lambda j: None)
        slots.finish(me, None)

    fetcher.job_seconds = 60.0  # jobs longer than a claim: no wait
    slots.notified = slots.stopping = False
    with slots.lock:
        slots.hand_out_locked([claimed_job(5), claimed_job(6)])
    slots.next_job(me, lambda j: None)
    slots.finish(me, None)
    with slots.lock:
        assert slots.lingers_locked()
        started = time.monotonic()
        fetcher.linger_locked()
    assert time.monotonic() - started < 5
