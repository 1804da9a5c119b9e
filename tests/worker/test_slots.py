"""Slots: the worker's shared bookkeeping, exercised alone (no database, no threads but
the test's own)."""

from __future__ import annotations

import threading
import time

from django_gator.attempts import Success
from django_gator.engines import ClaimedJob
from django_gator.worker.slots import Slots
from tests.factories import claimed_job


def job(job_id: int, *, suspect: bool = False) -> ClaimedJob:
    return claimed_job(job_id, name="n", suspect=suspect)


def test_claims_are_wanted_only_while_a_slot_is_free():
    slots = Slots(concurrency=2)
    with slots.lock:
        assert slots.wants_fetch_locked()
        assert slots.next_round_locked().free == 2
        slots.hand_out_locked([job(1), job(2)])
        assert not slots.wants_fetch_locked()
        assert slots.next_round_locked().free == 0


def test_a_suspect_is_held_until_it_can_run_alone():
    slots = Slots(concurrency=4)
    me = threading.current_thread()
    with slots.lock:
        held = slots.hand_out_locked([job(1), job(2, suspect=True)])
    assert [j.id for j in held] == [2]
    assert slots.next_job(me, lambda j: None).id == 1  # the ordinary job runs
    with slots.lock:
        turn = slots.next_round_locked()
        assert (turn.free, turn.suspect) == (0, None)  # no claims while a suspect waits
        assert not slots.wants_fetch_locked()

    assert slots.finish(me, None)
    with slots.lock:
        assert slots.wants_fetch_locked()  # the suspect may start now
        turn = slots.next_round_locked()
    assert turn.suspect is not None
    assert turn.suspect.id == 2
    slots.start_isolated(turn.suspect)
    assert slots.next_job(me, lambda j: None).id == 2
    with slots.lock:
        assert slots.next_round_locked().free == 0  # nothing beside it
    assert slots.finish(me, None)
    assert slots.isolated is None
    with slots.lock:
        assert slots.next_round_locked().free == 4


def test_a_finished_success_waits_for_the_fetcher_to_write_it():
    slots = Slots(concurrency=1)
    me = threading.current_thread()
    with slots.lock:
        slots.hand_out_locked([job(7)])
    running = slots.next_job(me, lambda j: None)
    assert slots.held_ids() == {7}
    assert slots.finish(me, (running, Success('"ok"'), 1.0))
    assert slots.held_ids() == {7}  # its mark is not written yet
    [(finished, success, _)] = slots.take_succeeded()
    assert (finished.id, success.result) == (7, '"ok"')
    assert slots.processed == 1
    assert slots.in_flight == 0


def test_the_watchdog_takes_an_expired_job_and_its_thread_retires():
    slots = Slots(concurrency=1)
    me = threading.current_thread()
    with slots.lock:
        slots.hand_out_locked([job(3)])
    slots.next_job(me, lambda j: time.monotonic() - 1)  # already past its deadline
    with slots.lock:
        [expired] = slots.expire_locked(time.monotonic())
        assert expired.job.id == 3
        assert [j.id for j in slots.take_timed_out_locked()] == [3]
    assert me in slots.retired
    assert not slots.still_running(me)
    assert slots.finish(me, None) is False  # the retiring thread writes nothing
    assert slots.in_flight == 0


def test_closing_returns_the_unstarted_jobs_and_lets_executors_exit():
    slots = Slots(concurrency=3)
    with slots.lock:
        slots.hand_out_locked([job(1), job(2, suspect=True)])
    unstarted = slots.close()
    assert sorted(j.id for j in unstarted) == [1, 2]
    assert slots.in_flight == 0
    assert slots.next_job(threading.current_thread(), lambda j: None) is None


def test_handing_out_wakes_one_executor_and_each_taker_wakes_the_next():
    """One notify for a hand-out, and each executor that takes a job while more are left
    wakes the next: no job is left waiting while an executor sleeps."""
    slots = Slots(concurrency=3)
    release = threading.Event()
    taken: dict[int, str] = {}

    def executor() -> None:
        me = threading.current_thread()
        running = slots.next_job(me, lambda j: None)
        assert running is not None
        taken[running.id] = me.name
        release.wait(10)  # busy with its job: the others must be woken for theirs
        slots.finish(me, None)

    threads = [threading.Thread(target=executor, name=f"e{i}") for i in range(3)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    # threading.Condition keeps its sleeping threads in _waiters; notify() removes one.
    while len(slots.work_ready._waiters) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    with slots.lock:
        slots.hand_out_locked([job(1), job(2), job(3)])
        assert len(slots.work_ready._waiters) == 2
    while len(taken) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    for thread in threads:
        thread.join(10)
    assert sorted(taken) == [1, 2, 3]
    assert len(set(taken.values())) == 3
    assert slots.in_flight == 0


def test_a_claim_lingers_only_while_running_jobs_hold_slots_and_nothing_else_calls():
    slots = Slots(concurrency=2)
    me = threading.current_thread()
    with slots.lock:
        assert not slots.lingers_locked()  # idle: claim at once
        slots.hand_out_locked([job(1), job(2)])
        assert not slots.lingers_locked()  # no slot free: nothing to claim for
    slots.next_job(me, lambda j: None)
    slots.finish(me, None)
    with slots.lock:
        assert slots.lingers_locked()  # one slot free, one job still in flight
        for flag in ("notified", "stopping"):
            setattr(slots, flag, True)
            assert not slots.lingers_locked(), flag
            setattr(slots, flag, False)
        slots.timed_out.append(job(3))
        assert not slots.lingers_locked()
        slots.timed_out.clear()
        slots.suspects.append(job(4, suspect=True))
        assert not slots.lingers_locked()
        slots.suspects.clear()
        assert slots.lingers_locked()
    slots.next_job(me, lambda j: None)
    slots.finish(me, None)
    with slots.lock:
        assert not slots.lingers_locked()  # every slot free


def test_a_lingering_fetcher_is_woken_only_by_the_finish_that_ends_its_wait():
    slots = Slots(concurrency=3)
    executors = [threading.Thread(name=f"e{i}") for i in range(3)]  # keys, never started
    with slots.lock:
        slots.hand_out_locked([job(1), job(2), job(3)])
    for executor in executors:
        slots.next_job(executor, lambda j: None)
    woken = threading.Event()

    def fetcher() -> None:
        with slots.lock:
            slots.lingering = True
            slots.fetch_needed.wait(30)
            slots.lingering = False
        woken.set()

    waiting = threading.Thread(target=fetcher, daemon=True)
    waiting.start()
    deadline = time.monotonic() + 10
    while not slots.fetch_needed._waiters and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slots.finish(executors[0], None)
    assert slots.finish(executors[1], None)
    assert not woken.wait(0.3)  # jobs still run: the wait goes on
    assert slots.finish(executors[2], None)
    assert woken.wait(10)  # the last one ends it


def test_each_ended_job_is_handed_to_the_next_round_once_as_a_freed_slot():
    """The fetcher's next round learns which jobs ended (their queue and name), so that a
    limited claim resting after it found every slot taken is made again (FlowRouter)."""
    slots = Slots(concurrency=2)
    me = threading.current_thread()
    with slots.lock:
        slots.hand_out_locked([claimed_job(1, name="a", queue="q1"), job(2)])
    slots.next_job(me, lambda j: None)
    assert slots.finish(me, None)  # a failure or an outcome written: no batched mark
    with slots.lock:
        assert slots.next_round_locked().freed == {("q1", "a")}
        assert slots.next_round_locked().freed == frozenset()
