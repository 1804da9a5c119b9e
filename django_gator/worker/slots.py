"""What a worker holds, and the one lock that guards it.

Every claimed job is in exactly one place until its outcome is handed on: ``pending``
(claimed, waiting for an executor), ``suspects`` (claimed, held until it can run alone:
see precise blame below), or ``running`` (an executor has it). ``in_flight`` counts them
all, and a worker claims while ``in_flight`` is below its concurrency (twice that while its
jobs are shorter than a claim: see :mod:`.ahead`). A finished
plain success waits in ``succeeded`` for the fetcher to write it with others; a job the
watchdog took from a stuck executor waits in ``timed_out`` for its failure to be written.

Precise blame: a *suspect* is a job taken back from a worker that died while running it.
It is claimed like any job, then held until nothing else runs here, and runs alone, so
that if it crashes this worker too, no other job is lost with it (and only crashes while
it ran alone count toward ``GATOR_MAX_RESCUES``).

The fetcher and the executors wait on two conditions of the same lock: executors on
``work_ready`` (a job was handed out, or the worker is closing), the fetcher on
``fetch_needed`` (a slot freed, a success to write, a NOTIFY, a stop).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from typing import Any, Literal

from django_gator.engines import ClaimedJob
from django_gator.worker.ahead import ClaimAhead
from django_gator.worker.async_slots import AsyncSlots
from django_gator.worker.entries import Finished, Idle, Round, Running

__all__ = ["Finished", "Idle", "Round", "Running", "Slots"]


class Slots:
    """The shared bookkeeping of one worker process. Methods take the lock themselves,
    except those whose names end in ``_locked``, which expect the caller to hold it."""

    def __init__(
        self,
        concurrency: int,
        async_concurrency: int = 0,
        runs_async: Callable[[ClaimedJob], bool] | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.ahead = ClaimAhead(concurrency)  # claims beyond the free slots, for short jobs
        # Async jobs (see .aio): ``async_concurrency`` of them run on the event loop beside
        # the executor threads, counted apart (and in ``in_flight`` too).
        self.async_slots = AsyncSlots(async_concurrency, runs_async)
        self.lock = threading.Lock()
        self.work_ready = threading.Condition(self.lock)  # executors wait here
        self.fetch_needed = threading.Condition(self.lock)  # the fetcher waits here
        self.pending: deque[ClaimedJob] = deque()
        self.suspects: deque[ClaimedJob] = deque()  # claimed, held, not started
        self.isolated: ClaimedJob | None = None  # the suspect running alone now
        # What each executor thread is running. Keyed by thread, not job id: a job that
        # failed with a retry due at once can be claimed again, and started by another
        # thread, before the thread that wrote its failure has taken it off this map.
        self.running: dict[threading.Thread, Running] = {}
        self.succeeded: list[Finished] = []
        self.timed_out: list[ClaimedJob] = []  # taken over by the watchdog, not yet written
        self.stalled: list[tuple[ClaimedJob, float]] = []  # the same, for stall_timeout
        self.retired: set[threading.Thread] = set()  # executors whose job timed out
        self.in_flight = 0  # claimed and not finished: pending + suspects + running
        self.notified = False  # a NOTIFY came for one of our queues
        self.woken: set[str] = set()  # the queues it named, until a round claims
        self.freed: set[tuple[str, str]] = set()  # (queue, name) of jobs ended since a round
        self.lingering = False  # the fetcher waits for fuller slots (see lingers_locked)
        #: Set while the fetcher waits with nothing claimed, running or to write (its
        #: last claim found nothing): what a test awaits before it dispatches a job that
        #: only a wakeup can start in time. Cleared when a claim brings jobs.
        self.idle = threading.Event()
        self.stopping = False  # no more claims
        self.closing = False  # executors exit once nothing is pending
        self.forced = False  # running jobs are not waited for
        self.processed = 0
        # Jobs this worker may still claim (--max-jobs; 0 once recycling): None = no limit.
        self.budget: int | None = None

    # -- the fetcher -----------------------------------------------------------------------
    def wants_fetch_locked(self) -> bool:
        """Whether the fetcher has something to do now."""
        return (
            self.stopping
            or bool(self.succeeded)
            or self.notified
            or bool(self.timed_out)
            or bool(self.stalled)
            or self.may_isolate_locked()
            or (self.free_locked() > 0 and not self.holding_locked() and self.budget != 0)
        )

    def free_locked(self) -> int:
        """Jobs to claim for: free executor slots, plus the async window (see AsyncSlots)."""
        aio = self.async_slots
        threads = self.concurrency - (self.in_flight - len(aio.running))
        if self.ahead.window:
            threads += self.ahead.allowance(self.running.values(), time.monotonic())
        return max(threads, 0) + aio.free()

    def next_round_locked(self) -> Round:
        """Start a fetcher round: how many slots to claim for, and a suspect to start."""
        # No claims while a suspect waits for the others to finish, or runs alone.
        held = bool(self.suspects) or self.isolated is not None
        self.notified = False
        free = 0 if held else self.free_locked()
        if self.budget is not None:
            free = min(free, self.budget)
        woken: frozenset[str] = frozenset()
        if free > 0 and self.woken:
            woken = frozenset(self.woken)
            self.woken.clear()
        freed: frozenset[tuple[str, str]] = frozenset()
        if self.freed:
            freed = frozenset(self.freed)
            self.freed.clear()
        return Round(
            stopping=self.stopping,
            free=free,
            idle=self.in_flight == 0,
            suspect=self.suspects.popleft() if self.may_isolate_locked() else None,
            woken=woken,
            freed=freed,
        )

    def lingers_locked(self) -> bool:
        """Whether a claim now would leave executor slots empty that jobs still running here
        are about to free, and nothing else asks for the fetcher: no stop, no NOTIFY of a
        new job (claimed at once, even one that came while every slot was busy), no
        timed-out job, no suspect held or running."""
        return (
            self.in_flight > 0
            and self.free_locked() > 0
            and not self.stopping
            and not self.notified
            and not self.woken
            and not self.timed_out
            and not self.stalled
            and not self.suspects
            and self.isolated is None
        )

    def holding_locked(self) -> bool:
        """Whether claims wait for a suspect: one is held while other jobs still run, or
        one runs alone. False once a held suspect may start, so the fetcher wakes to
        start it."""
        if self.isolated is not None:
            return True
        return bool(self.suspects) and not self.may_isolate_locked()

    def may_isolate_locked(self) -> bool:
        """A held suspect may start: nothing else is claimed or running here."""
        return (
            bool(self.suspects) and self.isolated is None and self.in_flight == len(self.suspects)
        )

    def hand_out_locked(self, jobs: Sequence[ClaimedJob]) -> list[ClaimedJob]:
        """Give claimed jobs to the executors, holding back suspects (returned)."""
        self.in_flight += len(jobs)
        if self.budget is not None:
            self.budget = max(self.budget - len(jobs), 0)
        if self.async_slots.runs_async is not None:
            threads_free = self.concurrency - (self.in_flight - len(self.async_slots.running))
            jobs = self.async_slots.take(jobs, threads_free)
        ordinary = [job for job in jobs if not job.suspect]
        held = [job for job in jobs if job.suspect]
        self.suspects.extend(held)
        self.pending.extend(ordinary)
        if ordinary:
            # One executor is woken; each that takes a job wakes the next while jobs are
            # left (see next_job), so short jobs are run by the threads already awake.
            self.work_ready.notify()
        return held

    def hold_again(self, suspect: ClaimedJob) -> None:
        """Put back a suspect the fetcher took but could not start."""
        with self.lock:
            self.suspects.appendleft(suspect)

    def start_isolated(self, job: ClaimedJob) -> None:
        """Hand a suspect to an executor, to run alone."""
        with self.lock:
            self.isolated = job
            self.pending.append(job)
            self.work_ready.notify()

    def forget(self, job: ClaimedJob) -> None:
        """Stop counting a claimed job that will not run here (given back or lost)."""
        with self.lock:
            self.in_flight -= 1
            self.fetch_needed.notify()

    def take_succeeded(self) -> list[Finished]:
        with self.lock:
            batch, self.succeeded = self.succeeded, []
        return batch

    def put_back_succeeded(self, batch: Sequence[Finished]) -> None:
        """Successes whose mark was not written (written next time: marks are idempotent)."""
        with self.lock:
            self.succeeded[:0] = batch

    def held_ids(self) -> set[int]:
        """The ids of every job this worker knows it holds, in any state."""
        with self.lock:
            known = {job.id for job in self.pending}
            known |= {job.id for job in self.suspects}
            known |= {entry.job.id for entry in self.running.values()}
            known |= {job.id for job in self.timed_out}
            known |= {job.id for job, _ in self.stalled}
            known |= {job.id for job, _, _ in self.succeeded}
            known |= {job.id for job in self.async_slots.running.values()}
            known |= {job.id for job in self.async_slots.waiting}
        return known

    def notify_fetcher(self, *, notified: bool = False, queues: Collection[str] = ()) -> None:
        """Wake the fetcher; ``notified``: a wakeup came for one of our queues, ``queues``
        the queues it named (claimed first, if they had run dry: see Claimer.claim)."""
        with self.lock:
            self.notified = self.notified or notified
            self.woken.update(queues)
            self.fetch_needed.notify()

    # -- executors -------------------------------------------------------------------------
    def next_job(
        self,
        thread: threading.Thread,
        deadline: Callable[[ClaimedJob], float | None],
        until: float | None = None,
    ) -> ClaimedJob | Literal[Idle.UNTIL] | None:
        """Wait for a job to run on ``thread``; None once the worker is closing.
        ``deadline(job)`` gives the job's timeout deadline (time.monotonic()). ``until``
        (time.monotonic()): stop waiting then, returning ``Idle.UNTIL``."""
        with self.lock:
            while not self.pending and not self.closing:
                if until is None:
                    self.work_ready.wait()
                    continue
                left = until - time.monotonic()
                if left <= 0:
                    return Idle.UNTIL
                self.work_ready.wait(left)
            if not self.pending:
                return None
            job = self.pending.popleft()
            if self.pending:
                self.work_ready.notify()  # the next job for another executor
            self.running[thread] = Running(job, thread, deadline(job))
            return job

    def watch_stall(self, thread: threading.Thread, journal: Any, stall: float | None) -> None:
        """Keep ``thread``'s journal with its job (for the watchdog, which writes the logs
        of a job it takes), and fail the job once ``journal.active_at`` is ``stall`` s old
        (expire_locked; None: never)."""
        with self.lock:
            entry = self.running.get(thread)
            if entry is not None:
                entry.journal, entry.stall = journal, stall
            self.fetch_needed.notify()  # the watchdog's next wake-up may be sooner now

    def still_running(self, thread: threading.Thread) -> bool:
        """Whether ``thread``'s job is still its own (the watchdog did not take it)."""
        with self.lock:
            return thread in self.running

    def finish(self, thread: threading.Thread, finished: Finished | None) -> bool:
        """``thread`` is done with its job; ``finished``, a plain success, waits for its
        batched mark. False if the watchdog took the job over (the thread retires)."""
        with self.lock:
            entry = self.running.pop(thread, None)
            if entry is None:
                return False
            self.ahead.ran(time.monotonic() - entry.started)
            if entry.job is self.isolated:
                self.isolated = None
            self.in_flight -= 1
            self.processed += 1
            self.freed.add((entry.job.queue, entry.job.name))
            if finished is not None:
                self.succeeded.append(finished)
            self.wake_fetcher_locked()
            return True

    def wake_fetcher_locked(self) -> None:
        """A job finished: wake the fetcher, unless it lingers for more slots and this one
        does not end its wait (the last running job does; the wait has a timeout)."""
        if not self.lingering or not self.lingers_locked():
            self.fetch_needed.notify()

    def finish_async(self, job: ClaimedJob, finished: Finished | None) -> ClaimedJob | None:
        """The event loop is done with ``job`` (its outcome written, or ``finished``, a
        plain success, to be batched); returns an async job waiting for its slot, which
        the loop starts now."""
        with self.lock:
            aio = self.async_slots
            if aio.running.pop(id(job), None) is None:
                return None
            self.in_flight -= 1
            self.processed += 1
            self.freed.add((job.queue, job.name))
            if finished is not None:
                self.succeeded.append(finished)
            self.wake_fetcher_locked()
            if not aio.waiting:
                return None
            following = aio.waiting.popleft()
            aio.running[id(following)] = following
            return following

    def expire_locked(self, now: float) -> list[Running]:
        """Take the jobs that ran past their deadline, or stalled past their
        stall_timeout, off their threads."""
        expired = []
        for entry in list(self.running.values()):
            stalled_at = entry.stall_deadline()
            if entry.deadline is not None and now > entry.deadline:
                self.timed_out.append(entry.job)
            elif stalled_at is not None and now > stalled_at:
                self.stalled.append((entry.job, float(entry.stall or 0)))
            else:
                continue
            expired.append(entry)
            self.ahead.ran(now - entry.started)
            del self.running[entry.thread]
            if entry.job is self.isolated:
                self.isolated = None
            self.in_flight -= 1
            self.retired.add(entry.thread)
        return expired

    def take_timed_out_locked(self) -> list[ClaimedJob]:
        expired, self.timed_out = self.timed_out, []
        return expired

    def take_stalled_locked(self) -> list[tuple[ClaimedJob, float]]:
        stalled, self.stalled = self.stalled, []
        return stalled

    def next_deadline_locked(self) -> float | None:
        deadlines = [
            d
            for r in self.running.values()
            for d in (r.deadline, r.stall_deadline())
            if d is not None
        ]
        return min(deadlines) if deadlines else None

    # -- recycling -------------------------------------------------------------------------
    def spent_locked(self) -> bool:
        """The claim budget is used up and every job claimed under it has finished (and
        its success mark has been written or handed to the fetcher): time to recycle."""
        return self.budget == 0 and self.in_flight == 0

    # -- shutdown --------------------------------------------------------------------------
    def stop(self, *, forced: bool = False) -> None:
        """No more claims; with ``forced``, running jobs are not waited for."""
        with self.lock:
            self.stopping = True
            self.forced = self.forced or forced
            self.fetch_needed.notify_all()

    def close(self) -> list[ClaimedJob]:
        """Stop claiming, let idle executors exit, and return the jobs claimed but never
        started (to be released)."""
        with self.lock:
            self.stopping = True
            unstarted = [*self.pending, *self.suspects, *self.async_slots.waiting]
            self.pending.clear()
            self.suspects.clear()
            self.async_slots.waiting.clear()
            self.in_flight -= len(unstarted)
            self.closing = True
            self.work_ready.notify_all()
            self.fetch_needed.notify_all()
        return unstarted
