"""The fetcher thread: it claims jobs for free executor slots and writes the batched
success marks of finished ones, in the same round trip.

One round of its loop: wait until there is something to do (a free slot, a success to
write, a NOTIFY, a timed-out job, a stop); while the jobs are shorter than a claim, wait a
little longer for the other slots (:meth:`Fetcher.linger_locked`); write the timeouts;
claim up to as many jobs as there are free slots, writing the finished successes with the
first claim; hand the jobs to the executors. With nothing to claim it waits: on
PostgreSQL for a NOTIFY (see :mod:`.listener`), elsewhere polling quickly after recent work
and backing off to ``GATOR_POLL_INTERVAL``.

A burst worker exits after a round that claimed nothing with nothing running, unless due
jobs of its queues are held back by a limit that will let them run (a concurrency slot held
by a job running elsewhere, a rate window) or by another transaction's row lock (the claim
skips locked rows): then it polls on until they have run. Scheduled jobs not yet due,
expired ones and the jobs of paused queues are not waited for.

It also starts suspects alone (see :mod:`.slots`), and after a claim failed it gives back
the jobs that claim may have taken without our knowing (:meth:`Fetcher.release_orphans`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence

from django.db import close_old_connections

from django_gator.engines import ClaimedJob, JobEngine
from django_gator.worker.claims import Claimer
from django_gator.worker.executor import Executors
from django_gator.worker.outcomes import Outcomes, has_steps
from django_gator.worker.retrier import backoff, drop_connection, refused
from django_gator.worker.slots import Finished, Round, Slots
from django_gator.worker.writes import Retrying, log_lost

logger = logging.getLogger("django_gator.worker")

#: First idle poll after work was found (polling engines); doubles up to the poll interval.
MIN_POLL = 0.005
#: Longest a claim waits for more executor slots to free up (see Fetcher.linger_locked).
MAX_LINGER = 0.002
#: Weight of the newest figure in the moving averages of claim and job durations.
AVERAGE_WEIGHT = 0.2


class Fetcher:
    """The claim loop of one worker (:meth:`run` is the fetcher thread's body)."""

    def __init__(
        self,
        *,
        engine: JobEngine,
        slots: Slots,
        claimer: Claimer,
        executors: Executors,
        outcomes: Outcomes,
        retrying: Retrying,
        stopped: threading.Event,
        poll_interval: float,
        burst: bool = False,
        listening: bool = False,
        on_drained: Callable[[], None] = lambda: None,
        start_async: Callable[[Sequence[ClaimedJob]], None] = lambda jobs: None,
    ) -> None:
        self.engine = engine
        self.slots = slots
        self.claimer = claimer
        self.executors = executors
        self.outcomes = outcomes
        self.retrying = retrying
        self.stopped = stopped  # set when the background threads are to stop
        self.poll_interval = poll_interval
        self.burst = burst
        self.listening = listening  # a listener wakes us: no need to poll quickly
        self.on_drained = on_drained  # a burst worker found nothing left to do
        self.start_async = start_async  # hands async jobs to the event loop (see .aio)
        self.worker_id = outcomes.worker_id
        #: Moving averages, in seconds: a claim round trip, and a job's run (from the
        #: batched successes). They decide whether a claim waits for fuller slots.
        self.claim_seconds = 0.0
        self.job_seconds = 0.0
        self._failures = 0  # claims failed in a row
        self._idle_wait = MIN_POLL  # the next idle poll's wait (polling engines)

    def run(self) -> None:
        while True:
            turn = self._await_round()
            self.executors.write_timeouts()
            if turn.stopping:
                if turn.suspect is not None:
                    self.slots.hold_again(turn.suspect)  # released by the shutdown
                self.outcomes.write_batch(self.slots.take_succeeded())
                return
            batch = self.slots.take_succeeded()
            claimed = self._claim(turn, batch)
            if claimed is None:
                continue
            jobs, written = claimed
            self.outcomes.settle_batch(batch, written)
            if turn.suspect is not None:
                # Every success mark is written by now (nothing else was running): a crash
                # from here on takes no finished job down with it.
                self.start_isolated(turn.suspect)
                continue
            if turn.free <= 0:
                continue
            if not self._hand_out(turn, jobs):
                return

    def _await_round(self) -> Round:
        """Wait until there is something to do (enforcing the timeouts meanwhile), linger
        for fuller slots, and take the round's turn."""
        slots = self.slots
        with slots.lock:
            while not slots.wants_fetch_locked():
                slots.fetch_needed.wait(self.executors.watchdog_wait_locked(self.poll_interval))
                self.executors.enforce_timeouts_locked()
            self.linger_locked()
            return slots.next_round_locked()

    def _claim(
        self, turn: Round, batch: list[Finished]
    ) -> tuple[list[ClaimedJob], list[int]] | None:
        """Claim for the round's free slots, writing ``batch``'s success marks (the
        workflow steps' first, with their workflows): the jobs claimed and the ids
        written. None after a failure: the batch is put back for the next round, which
        comes after a backoff and first gives back what the failed claim may have taken."""
        try:
            close_old_connections()
            self.engine.prepare_bookkeeping()
            if self._failures:
                self.release_orphans(batch)
            marks, written = self.outcomes.write_steps(batch)  # with their workflows
            started = time.perf_counter()
            jobs, marked = self.claimer.claim(turn.free, marks, turn.woken, turn.freed)
            written += marked
            self.measure(time.perf_counter() - started, batch)
            self._failures = 0
        except Exception as exc:
            self._failures += 1
            logger.exception("Claim failed; retrying worker=%s", self.worker_id)
            drop_connection(self.engine.alias)
            if refused(exc) and has_steps(batch):
                # Perhaps the steps' batched write: it would fail the same way again.
                batch = self.outcomes.write_steps_alone(batch)
            self.slots.put_back_succeeded(batch)  # written next time (marks are idempotent)
            if turn.suspect is not None:
                self.slots.hold_again(turn.suspect)
            self.stopped.wait(backoff(self._failures))
            return None
        return jobs, written

    def _hand_out(self, turn: Round, jobs: list[ClaimedJob]) -> bool:
        """Give the claimed jobs to the executors and the event loop, or with none, wait
        for the next round. False when the fetcher is to end: a stop came in (the jobs
        go straight back), or a burst worker found nothing left to do."""
        slots = self.slots
        # A burst worker that found nothing: read, before taking the lock, whether due
        # jobs wait for a limit that will let them run (then it waits for them).
        held_back = not jobs and self.burst and turn.idle and self._held_back()
        with slots.lock:
            stopping = slots.stopping
            if not jobs and not stopping:
                return self._idle_locked(turn, held_back)
            if not stopping:
                slots.idle.clear()
                held = slots.hand_out_locked(jobs)
                for_loop = slots.async_slots.take_started()
                self._idle_wait = MIN_POLL
        if stopping:
            if jobs:
                # A stop came in while we were claiming: hand these straight back.
                self.retrying("release jobs", functools.partial(self.outcomes.release, jobs))
            return False
        if for_loop:
            self.start_async(for_loop)
        if held:
            logger.info(
                "Holding suspects until they can run alone worker=%s ids=%s",
                self.worker_id,
                ",".join(str(job.id) for job in held),
            )
        return True

    def _idle_locked(self, turn: Round, held_back: bool) -> bool:
        """A claim that found nothing (lock held): end a drained burst worker (False), or
        wait, polling sooner after recent work, unless a success or a wakeup waits."""
        slots = self.slots
        if (
            self.burst
            and turn.idle
            and slots.in_flight == 0
            and not slots.succeeded
            and not held_back
        ):
            self.on_drained()
            return False
        if self.listening:
            wait = self.poll_interval
        else:
            wait = self._idle_wait
            self._idle_wait = min(self._idle_wait * 2, self.poll_interval)
        if not slots.succeeded and not slots.notified:
            if slots.in_flight == 0 and not slots.idle.is_set():
                slots.idle.set()
                logger.debug("Worker idle worker=%s", self.worker_id)
            slots.fetch_needed.wait(
                min(wait, self.executors.watchdog_wait_locked(self.poll_interval))
            )
        return True

    def _held_back(self) -> bool:
        """A burst worker that found nothing to claim: whether due jobs of its queues wait
        for a limit that will let them run (a slot held by a job running elsewhere, a rate
        window): it then polls on instead of exiting. A failed read counts as held back
        (the next round tries again)."""
        try:
            return self.claimer.held_back()
        except Exception:
            logger.exception("Reading the held-back jobs failed worker=%s", self.worker_id)
            drop_connection(self.engine.alias)
            return True

    def linger_locked(self) -> None:
        """Before a claim for few executor slots while the others still run short jobs:
        wait up to about one claim's duration for more of them to free up (lock held).

        A claim costs about as much for one job as for a dozen. When the jobs run for less
        time than a claim takes, the other slots free up meanwhile, and one claim then
        serves them all instead of one claim each (on a busy machine, where threads are
        woken late and one by one, that is most claims). Jobs that run longer than a claim
        are not waited for; neither are an idle worker, a stop, a timed-out job or a
        suspect (see Slots.lingers_locked). The wait is at most MAX_LINGER."""
        linger = min(self.claim_seconds, MAX_LINGER)
        if self.job_seconds >= linger:
            return
        slots = self.slots
        deadline = time.monotonic() + linger
        slots.lingering = True
        try:
            while slots.lingers_locked():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                slots.fetch_needed.wait(remaining)
        finally:
            slots.lingering = False

    def measure(self, claim_seconds: float, batch: Sequence[Finished]) -> None:
        """Fold a claim's duration, and the run times of the successes it marked, into the
        moving averages."""
        self.claim_seconds += AVERAGE_WEIGHT * (claim_seconds - self.claim_seconds)
        self.slots.ahead.window = self.claim_seconds  # jobs shorter than it: claim ahead
        if batch:
            run = sum(elapsed_ms for _, _, elapsed_ms in batch) / len(batch) / 1000
            self.job_seconds += AVERAGE_WEIGHT * (run - self.job_seconds)

    def start_isolated(self, job: ClaimedJob) -> None:
        """Run a suspect alone: record on its row that this attempt is isolated (so that
        losing this worker now is blamed on it), then hand it to an executor."""
        written = self.retrying(
            f"isolate job {job.id}",
            lambda: self.engine.isolate(self.worker_id, job.id, job.attempts),
        )
        if written:
            self.slots.start_isolated(job)
            return
        self.slots.forget(job)
        if written is False:
            log_lost(job, "isolated run")
        else:  # a forced stop: hand it back
            self.retrying("release a suspect", functools.partial(self.outcomes.release, [job]))

    def release_orphans(self, unmarked: Sequence[Finished]) -> None:
        """After a failed claim: give back the jobs it claimed without our knowing.

        A claim can commit and its answer still be lost (the connection dies between the
        COMMIT and the reply). Those rows are ``running`` under our worker id, and as our
        heartbeat goes on nobody would ever rescue them. Only the fetcher claims, so any
        running row of ours that no thread holds is such an orphan; it goes back to
        ``waiting`` with its attempt uncharged, as the job never started."""
        held = self.engine.running_claims(self.worker_id)
        known = self.slots.held_ids() | {job.id for job, _, _ in unmarked}
        orphans = [claim for claim in held if claim.id not in known]
        if orphans:
            released = self.engine.with_steps(  # a cancelled orphan may be a workflow step
                [claim.id for claim in orphans],
                None,
                functools.partial(self.engine.release, self.worker_id, orphans),
            )
            logger.warning(
                "Released jobs claimed by a claim whose answer was lost worker=%s ids=%s",
                self.worker_id,
                ",".join(map(str, released)) or "-",
            )
