"""The event loop of a worker process (django_gator/worker/aio.py), driven directly: jobs
claimed by the test are handed to an AsyncRunner through the slots, as the fetcher hands
them, and its outcomes are written by the worker's Outcomes. No worker process, no
fetcher; tests/test_async_jobs.py runs async jobs through whole workers."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator

import pytest
from asgiref.sync import sync_to_async

from django_gator import Queueable, Retry
from django_gator.engines import ClaimedJob, get_engine
from django_gator.models import Job, JobState
from django_gator.worker import aio
from django_gator.worker.outcomes import Outcomes
from django_gator.worker.slots import Slots
from django_gator.worker.threads import WorkerThreads
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "aio-test"
QUEUE = "aio-direct"
#: Seconds any wait of these tests gives up after (a failure, never a pause).
PATIENCE = 20.0


class Probe:
    """What the jobs below tell the test (under one condition), and the gates that hold
    them on the loop until the test opens them."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.entered: list[int] = []  # job ids, in the order their handlers began
        self.running = 0
        self.most = 0  # the most handlers running at once
        self.cancelled: list[int] = []  # jobs whose coroutine saw a CancelledError
        self.loops: dict[int, asyncio.AbstractEventLoop] = {}
        self.threads: dict[int, str] = {}
        self.gates: dict[int, asyncio.Event] = {}

    async def hold(self, job_id: int) -> None:
        """Hold job ``job_id`` until the test opens its gate (see open)."""
        gate = asyncio.Event()
        with self.changed:
            self.gates[job_id] = gate
            self.loops[job_id] = asyncio.get_running_loop()
            self.threads[job_id] = threading.current_thread().name
            self.entered.append(job_id)
            self.running += 1
            self.most = max(self.most, self.running)
            self.changed.notify_all()
        try:
            await gate.wait()
        except asyncio.CancelledError:
            with self.changed:
                self.cancelled.append(job_id)
                self.changed.notify_all()
            raise
        finally:
            with self.changed:
                self.running -= 1
                self.changed.notify_all()

    def open(self, job_id: int) -> None:
        with self.changed:
            gate, loop = self.gates[job_id], self.loops[job_id]
        loop.call_soon_threadsafe(gate.set)

    def wait(self, predicate: Callable[[], bool]) -> None:
        with self.changed:
            assert self.changed.wait_for(predicate, timeout=PATIENCE), predicate


probe = Probe()


class Held(Queueable):
    """Runs until the test opens its gate; returns the name of its thread."""

    queue = QUEUE

    async def handle(self) -> str:
        await probe.hold(self.job_id)
        return threading.current_thread().name


class HeldPastItsTimeout(Queueable):
    """Waits for a gate nobody opens, past its timeout; never retried."""

    queue = QUEUE
    timeout = 0.2
    retry = Retry(max_retries=0)

    async def handle(self) -> None:
        await probe.hold(self.job_id)


class RaisesAsync(Queueable):
    queue = QUEUE
    retry = Retry(max_retries=0)

    async def handle(self) -> None:
        raise ValueError("async no")


class UsesTheOrm(Queueable):
    """Writes a row through sync_to_async; returns the thread that wrote it."""

    queue = QUEUE

    async def handle(self) -> str:
        def write() -> str:
            name = threading.current_thread().name
            Execution.objects.create(job_id=self.job_id, attempt=self.attempt, pid=0, label=name)
            return name

        return await sync_to_async(write)()


class Harness:
    """An AsyncRunner with the worker's slots, outcomes and threads, and nothing else."""

    def __init__(self, async_concurrency: int) -> None:
        self.engine = get_engine("default")
        self.engine.register_worker(WORKER, "h", 1, "[]", 1)
        self.slots = Slots(1, async_concurrency, aio.runs_async)
        self.crashed: list[str] = []
        self.threads = WorkerThreads(self.slots, WORKER, lambda: self.crashed.append("crash"))
        self.outcomes = Outcomes(self.engine, WORKER)
        self.runner = aio.AsyncRunner(self.slots, self.outcomes, self.threads.spawn)
        self.runner.start()

    def hand_out(self, count: int) -> list[ClaimedJob]:
        """Claim ``count`` jobs and hand them out as the fetcher does: the async ones
        within the async concurrency start on the loop, the others wait for a slot."""
        jobs = self.engine.claim(WORKER, QUEUE, count)
        assert len(jobs) == count
        with self.slots.lock:
            self.slots.hand_out_locked(jobs)
            started = self.slots.async_slots.take_started()
        self.runner.submit(started)
        return jobs

    def wait_until_finished(self) -> None:
        """Until every job handed out has been handed back to the slots."""
        with self.slots.lock:
            assert self.slots.fetch_needed.wait_for(
                lambda: self.slots.in_flight == 0, timeout=PATIENCE
            )


@pytest.fixture
def harness() -> Iterator[Callable[[int], Harness]]:
    made: list[Harness] = []
    global probe
    probe = Probe()

    def make(async_concurrency: int = 4) -> Harness:
        made.append(Harness(async_concurrency))
        return made[-1]

    yield make
    for one in made:
        if one.runner.loop is not None and not one.runner.loop.is_closed():
            one.runner.close(cancel=True)  # what a test left held
        assert one.crashed == []


def _state(job: ClaimedJob) -> tuple[str, int]:
    row = Job.objects.get(pk=job.id)
    return row.state, row.attempts


def test_async_jobs_run_on_the_runners_loop_in_its_thread(harness):
    h = harness()
    rows = [Held.dispatch() for _ in range(2)]

    h.hand_out(2)
    probe.wait(lambda: len(probe.entered) == 2)

    assert sorted(probe.entered) == sorted(r.pk for r in rows)
    assert {probe.loops[r.pk] for r in rows} == {h.runner.loop}
    assert {probe.threads[r.pk] for r in rows} == {"gator-aio"}
    assert h.runner.thread is not None
    assert h.runner.thread.name == "gator-aio"
    for row in rows:
        probe.open(row.pk)
    h.wait_until_finished()


def test_a_plain_success_goes_back_to_the_slots_for_the_batched_mark(harness):
    h = harness()
    row = Held.dispatch()

    [job] = h.hand_out(1)
    probe.wait(lambda: probe.entered == [row.pk])
    probe.open(row.pk)
    h.wait_until_finished()

    # Deferred, as a thread's plain success is: running until the fetcher's mark.
    assert _state(job) == (JobState.RUNNING, 1)
    [(finished, success, elapsed_ms)] = h.slots.take_succeeded()
    assert (finished.id, success.written) == (row.pk, None)
    assert json.loads(success.result) == "gator-aio"  # the result's JSON
    assert elapsed_ms > 0
    assert h.slots.processed == 1
    h.outcomes.write_batch([(finished, success, elapsed_ms)])
    assert _state(job) == (JobState.SUCCEEDED, 1)
    assert Job.objects.get(pk=row.pk).result == "gator-aio"


def test_a_failure_is_written_at_once_by_the_outcomes(harness):
    h = harness()
    row = RaisesAsync.dispatch()

    [job] = h.hand_out(1)
    h.wait_until_finished()

    assert _state(job) == (JobState.DEAD, 1)
    assert Job.objects.get(pk=row.pk).last_error == "ValueError: async no"
    assert h.slots.take_succeeded() == []
    assert h.slots.processed == 1


def test_sync_calls_run_on_the_one_orm_thread(harness):
    h = harness()
    rows = [UsesTheOrm.dispatch() for _ in range(3)]

    h.hand_out(3)
    h.wait_until_finished()

    names = set(
        Execution.objects.filter(job_id__in=[r.pk for r in rows]).values_list("label", flat=True)
    )
    assert names == {"gator-aio-orm-1"}
    results = {json.loads(s.result) for _, s, _ in h.slots.take_succeeded()}
    assert results == {"gator-aio-orm-1"}


def test_no_more_than_the_async_concurrency_run_at_once(harness):
    h = harness(async_concurrency=2)
    rows = [Held.dispatch() for _ in range(4)]

    h.hand_out(4)
    probe.wait(lambda: len(probe.entered) == 2)

    with h.slots.lock:
        assert len(h.slots.async_slots.running) == 2
        assert len(h.slots.async_slots.waiting) == 2
    assert probe.entered == [r.pk for r in rows[:2]]
    # Each job that ends starts one that waited for its slot, in the order claimed.
    probe.open(rows[0].pk)
    probe.wait(lambda: len(probe.entered) == 3)
    assert probe.entered[2] == rows[2].pk
    probe.open(rows[1].pk)
    probe.wait(lambda: len(probe.entered) == 4)
    for row in rows[2:]:
        probe.open(row.pk)
    h.wait_until_finished()

    assert probe.most == 2
    assert len(h.slots.take_succeeded()) == 4


def test_a_coroutine_past_its_timeout_is_cancelled_and_fails_with_jobtimeout(harness):
    h = harness()
    row = HeldPastItsTimeout.dispatch()

    [job] = h.hand_out(1)
    h.wait_until_finished()

    assert probe.cancelled == [row.pk]  # the handler saw the cancellation at its await
    assert _state(job) == (JobState.DEAD, 1)
    assert Job.objects.get(pk=row.pk).last_error == (
        "django_gator.exceptions.JobTimeout: job ran longer than its timeout of 0.2 s"
    )


def test_close_waits_for_the_running_jobs_and_their_outcomes(harness):
    h = harness()
    rows = [Held.dispatch() for _ in range(2)]
    h.hand_out(2)
    probe.wait(lambda: len(probe.entered) == 2)

    closer = threading.Thread(target=h.runner.close)
    closer.start()
    probe.open(rows[0].pk)
    with h.slots.lock:
        assert h.slots.fetch_needed.wait_for(lambda: h.slots.processed == 1, timeout=PATIENCE)
    assert closer.is_alive()  # the other job still runs
    probe.open(rows[1].pk)
    closer.join(PATIENCE)

    assert not closer.is_alive()
    assert probe.cancelled == []
    assert sorted(j.id for j, _, _ in h.slots.take_succeeded()) == [r.pk for r in rows]
    assert h.slots.in_flight == 0
    assert h.runner.loop is not None
    assert h.runner.loop.is_closed()
    # The loop's thread, its ORM thread and its writers have ended.
    assert not [t for t in h.threads.running() if t.name.startswith("gator-aio")]


def test_a_forced_close_cancels_running_jobs_and_writes_nothing(harness):
    h = harness()
    row = Held.dispatch()
    [job] = h.hand_out(1)
    probe.wait(lambda: probe.entered == [row.pk])

    h.runner.close(cancel=True)

    assert probe.cancelled == [row.pk]
    # Left to the worker, which gives it back (Outcomes.hand_back): still ours, running.
    assert _state(job) == (JobState.RUNNING, 1)
    with h.slots.lock:
        assert list(h.slots.async_slots.running.values()) == [job]
    assert h.slots.take_succeeded() == []
    assert h.outcomes.hand_back([job]) == [row.pk]
    assert _state(job) == (JobState.WAITING, 0)
