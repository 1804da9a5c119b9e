"""Executor threads run one job at a time; the watchdog takes a job from an executor that
ran past the job's timeout.

An executor takes a job from :class:`~django_gator.worker.slots.Slots`, runs it (see
:func:`~django_gator.worker.execution.run_claimed`) and hands its outcome to
:class:`~django_gator.worker.outcomes.Outcomes`: a failure, a chain step or an atomic job
is written at once; a plain success is left in the slots for the fetcher to write with
others in one statement.

The watchdog runs on the fetcher thread, which wakes for the next deadline (a job's
timeout, or its ``stall_timeout`` after its last progress, checkpoint or heartbeat: then
JobStalled instead of JobTimeout). A timed-out job's slot gets a fresh executor thread at
once, and the stuck thread gets a JobTimeout raised in it: that interrupts Python code,
not a blocking call. When the stuck thread finally returns, it sees that the job is no
longer its own, writes nothing, and exits.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence

from django.db import connections

from django_gator.attempts import Success
from django_gator.engines import ClaimedJob, JobEngine
from django_gator.exceptions import JobNotRegistered, JobStalled, JobTimeout
from django_gator.longjobs import Journal
from django_gator.queueable import effective_timeout, get_job_class
from django_gator.worker.execution import run_claimed
from django_gator.worker.hygiene import after_job, before_job
from django_gator.worker.isolation import isolates, run_isolated
from django_gator.worker.outcomes import DEFERRED, Outcomes
from django_gator.worker.progress import journal_for
from django_gator.worker.queues import QueueSpec
from django_gator.worker.slots import Finished, Idle, Slots
from django_gator.worker.warm import WarmConnections, warm_aliases

logger = logging.getLogger("django_gator.worker")

#: Starts a named thread running a function (the supervisor's, which watches it).
Spawn = Callable[[str, Callable[[], None]], threading.Thread]


class Executors:
    """The executor threads of one worker, and their watchdog."""

    def __init__(
        self,
        slots: Slots,
        outcomes: Outcomes,
        engine: JobEngine,
        spawn: Spawn,
        specs: Sequence[QueueSpec] = (),
    ) -> None:
        self.slots = slots
        self.outcomes = outcomes
        self.engine = engine
        self.spawn = spawn
        self.started = 0
        #: The connections each executor thread opens before it takes a job.
        self.warm_aliases = warm_aliases(engine.alias)
        #: Queues whose every job runs in a child process (--isolate-queue).
        self.isolated_queues = frozenset(s.name for s in specs if s.isolated)
        #: Journals (with captured logs) of the jobs the watchdog took, by job id.
        self.taken_logs: dict[int, Journal] = {}

    def start(self, count: int) -> None:
        for _ in range(count):
            self.start_one()

    def start_one(self) -> threading.Thread:
        self.started += 1
        return self.spawn(f"gator-executor-{self.started}", self.loop)

    # -- one executor thread ---------------------------------------------------------------
    def loop(self) -> None:
        """An executor thread's life: jobs until the worker closes."""
        me = threading.current_thread()
        warm = WarmConnections(self.warm_aliases)
        while True:
            # Not while closing: a connect to a server that does not answer would only delay
            # the thread's end.
            until = None if self.slots.closing else warm.warm()
            job = self.slots.next_job(me, deadline, until=until)
            if job is Idle.UNTIL:
                continue  # a connection to renew, or to try again
            if job is None:
                return
            finished: Finished | None = None
            try:
                finished = self.execute(job)
            except BaseException as exc:
                logger.exception("Executor error id=%s", job.id)
                if self.slots.still_running(me):  # else the watchdog writes its outcome
                    self.outcomes.worker_error(job, exc)
            if not self.slots.finish(me, finished):
                return  # timed out: a fresh thread has this slot; this one retires

    def execute(self, job: ClaimedJob) -> Finished | None:
        """Run the job and record its outcome; a plain success is returned, for the
        fetcher to write with others."""
        thread_connections = connections.all()
        before_job(thread_connections)
        started = time.perf_counter()
        commit = functools.partial(self.outcomes.commit, job)
        stopping = functools.partial(getattr, self.slots, "stopping")
        journal = journal_for(job, self.engine, self.outcomes.worker_id, stopping=stopping)
        stall = stall_timeout(job)
        if stall is not None or journal.logs is not None:
            self.slots.watch_stall(threading.current_thread(), journal, stall)
        try:
            if isolates(job, self.isolated_queues):
                outcome = run_isolated(job, self.outcomes.worker_id, journal, stopping=stopping)
            else:
                outcome = run_claimed(
                    job,
                    self.outcomes.worker_id,
                    commit,
                    watch=thread_connections,
                    atomic=self.engine.atomic_job,
                    journal=journal,
                )
        finally:
            elapsed_ms = (time.perf_counter() - started) * 1000
            after_job(thread_connections)
        if not self.slots.still_running(threading.current_thread()):
            # The watchdog took this job over and writes its JobTimeout outcome; whatever
            # this thread ended with (often the JobTimeout raised into it) is not written.
            return None
        if self.outcomes.record(job, outcome, elapsed_ms, batch=True) != DEFERRED:
            return None
        assert isinstance(outcome, Success)
        return job, outcome, elapsed_ms

    # -- the watchdog (on the fetcher thread) ----------------------------------------------
    def watchdog_wait_locked(self, poll_interval: float) -> float:
        """Seconds until the next job deadline, at most ``poll_interval`` (lock held)."""
        deadline = self.slots.next_deadline_locked()
        if deadline is None:
            return poll_interval
        return max(deadline - time.monotonic(), 0.001)

    def enforce_timeouts_locked(self) -> None:
        """Take the jobs that ran past their timeout from their threads, and give each
        slot a fresh thread (lock held). Their failures are written by
        :meth:`write_timeouts`."""
        for entry in self.slots.expire_locked(time.monotonic()):
            if entry.journal is not None and entry.journal.logs is not None:
                self.taken_logs[entry.job.id] = entry.journal
            self.start_one()
            timed_out = entry.deadline is not None and time.monotonic() > entry.deadline
            interrupt(entry.thread, JobTimeout if timed_out else JobStalled)

    def write_timeouts(self) -> None:
        """Write the outcome of every job the watchdog took over (on the fetcher thread,
        before the next claim, so a burst worker never exits with one unwritten)."""
        with self.slots.lock:
            self.enforce_timeouts_locked()
            expired = self.slots.take_timed_out_locked()
            stalled = self.slots.take_stalled_locked()
        for job in expired:
            self._write_taken_logs(job)
            self.outcomes.timeout(job)
        for job, seconds in stalled:
            self._write_taken_logs(job)
            self.outcomes.stalled(job, seconds)

    def _write_taken_logs(self, job: ClaimedJob) -> None:
        """The captured logs of a job the watchdog took, written before its failure
        (unless its thread, interrupted, wrote them already)."""
        journal = self.taken_logs.pop(job.id, None)
        if journal is not None:
            journal.write_logs()


def deadline(job: ClaimedJob) -> float | None:
    """When (time.monotonic()) a job started now times out; None without a timeout."""
    try:
        timeout = effective_timeout(get_job_class(job.name))
    except JobNotRegistered:
        return None
    return None if timeout is None else time.monotonic() + timeout


def stall_timeout(job: ClaimedJob) -> float | None:
    """The job class's ``stall_timeout`` (None: none, or an unknown name)."""
    try:
        return get_job_class(job.name).stall_timeout
    except JobNotRegistered:
        return None


def interrupt(thread: threading.Thread, exc_type: type[BaseException]) -> None:
    """Raise ``exc_type`` in ``thread`` at its next Python instruction (best effort)."""
    if thread.ident is None:
        return
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type)
    )
