"""The worker process: threads, signals, heartbeats, rescue, timeouts and shutdown.

Threads (each with its own database connection, as Django gives every thread its own):

- the *fetcher* owns the claim loop: it writes the batched success marks of finished jobs,
  then claims up to as many jobs as there are free executor slots (one statement per queue,
  queues tried in weighted random order), and enforces job timeouts;
- *executors* (``--concurrency`` of them) run one job at a time; a failure is written at
  once, a success is handed to the fetcher to be written with others in one statement;
- the *heartbeat* thread refreshes this worker's row and rescues the jobs of workers whose
  heartbeat lapsed;
- on PostgreSQL a *listener* waits for NOTIFY from dispatch and wakes the fetcher, so an
  idle worker starts a new job within milliseconds of its commit. Elsewhere the fetcher
  polls, quickly after recent work and backing off to ``GATOR_POLL_INTERVAL``.

Signal handlers only set flags; the main thread does the shutdown.
"""

from __future__ import annotations

import ctypes
import functools
import json
import logging
import os
import random
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from secrets import token_hex
from types import FrameType
from typing import Any, TypeVar

from django.db import (
    DatabaseError,
    InterfaceError,
    InternalError,
    OperationalError,
    close_old_connections,
    connections,
    reset_queries,
)

from django_gator import conf, schema
from django_gator.chain import error_handler, next_step
from django_gator.engines import ClaimedJob, get_engine
from django_gator.engines.base import Failure
from django_gator.exceptions import JobNotRegistered, JobTimeout, SchemaMissing, WorkerLost
from django_gator.logutil import safe
from django_gator.queueable import get_job_class
from django_gator.redaction import mask_text, secret_values
from django_gator.worker import connections as worker_connections
from django_gator.worker.claims import Claimer
from django_gator.worker.execution import (
    Success,
    error_entry,
    failure_for,
    outcome_state,
    run_claimed,
    unstorable_failure,
)
from django_gator.worker.liveness import Liveness, local_worker
from django_gator.worker.queues import QueueSpec

logger = logging.getLogger("django_gator.worker")

T = TypeVar("T")
#: Longest pause between two tries of a write while the database is unreachable.
MAX_BACKOFF = 5.0
#: First idle poll after work was found (polling engines); doubles up to the poll interval.
MIN_POLL = 0.005
#: Seconds between two rescue passes that also look for running jobs whose owner has no
#: worker row at all (a scan of every running entry; the other passes look by owner).
ORPHAN_SWEEP_EVERY = 60.0
#: Database errors worth retrying: the connection or the server, not the statement.
TRANSIENT_ERRORS = (OperationalError, InterfaceError, InternalError)


@dataclass(slots=True)
class _Running:
    job: ClaimedJob
    thread: threading.Thread
    deadline: float | None  # time.monotonic() after which the job has timed out


class WorkerProcess:
    """One ``gator_worker`` process. ``run()`` blocks until the worker stops."""

    def __init__(
        self,
        queues: Sequence[QueueSpec] = (),
        *,
        concurrency: int | None = None,
        burst: bool = False,
        shutdown_timeout: float | None = None,
        poll_interval: float | None = None,
        alias: str | None = None,
        install_signal_handlers: bool = True,
        rng: random.Random | None = None,
        scheduler: bool | None = None,
    ) -> None:
        self.specs = list(queues)
        self.concurrency = concurrency or conf.concurrency()
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        self.burst = burst
        self.shutdown_timeout = (
            conf.shutdown_timeout() if shutdown_timeout is None else shutdown_timeout
        )
        self.poll_interval = conf.poll_interval() if poll_interval is None else poll_interval
        self.alias = alias or conf.database()
        # Burst workers drain and exit; they leave the schedules to long-running workers.
        self.run_scheduler = (
            conf.scheduler_enabled() and not burst if scheduler is None else scheduler
        )
        self.install_signal_handlers = install_signal_handlers
        self.rng = rng or random.Random()
        self.hostname = socket.gethostname()
        self.pid = os.getpid()
        self.worker_id = f"{self.hostname}:{self.pid}:{token_hex(4)}"
        self.engine = get_engine(self.alias)
        self.claimer = Claimer(self.engine, self.worker_id, self.specs, self.rng)

        self._lock = threading.Lock()
        self._work_ready = threading.Condition(self._lock)  # executors wait here
        self._fetch_needed = threading.Condition(self._lock)  # the fetcher waits here
        self._pending: deque[ClaimedJob] = deque()
        # Precise blame: suspects (jobs taken back from a lost worker) are claimed like any
        # job, then held until nothing else runs here, and run one at a time, alone.
        self._suspects: deque[ClaimedJob] = deque()  # claimed, held, not started
        self._isolated: ClaimedJob | None = None  # the suspect running alone now
        # What each executor thread is running. Keyed by thread, not job id: a job that
        # failed with a retry due at once can be claimed again, and started by another
        # thread, before the thread that wrote its failure has taken it off this map.
        self._running: dict[threading.Thread, _Running] = {}
        self._succeeded: list[tuple[ClaimedJob, Success, float]] = []
        self._timed_out: list[ClaimedJob] = []  # to be written by the fetcher
        self._retired: set[threading.Thread] = set()  # executors whose job timed out
        self._in_flight = 0  # claimed and not finished: pending + running
        self._notified = False
        self._stopping = False  # no more claims
        self._closing = False  # executors exit once the pending queue is empty
        self._forced = False
        self._signals = 0
        self._executor_count = 0
        self._wake = threading.Event()
        self._done = threading.Event()
        self._stop_background = threading.Event()
        self._threads: list[threading.Thread] = []
        self._listening = False
        self._last_beat = time.monotonic()  # when our last heartbeat was written
        self._judge_after = 0.0  # no rescues before this time.monotonic() (see _may_rescue)
        self._last_sweep = -ORPHAN_SWEEP_EVERY  # the first rescue pass sweeps
        self._spared: set[str] = set()  # lapsed workers found alive on this host (logged)
        self.processed = 0
        self.forced_exit = False

    # -- lifecycle ---------------------------------------------------------------------
    def run(self) -> int:
        """Work until stopped (or, with ``burst``, until nothing is due); returns 0."""
        restore = _keep_connections_open()
        try:
            return self._run()
        finally:
            restore()

    def _run(self) -> int:
        # Handlers first: a SIGTERM during start-up (the database may be down, and the
        # worker retrying) stops the worker as well as one that comes later.
        previous = self._install_signals() if self.install_signal_handlers else {}
        try:
            if not self._start_up():
                logger.info("Worker stopped before it started id=%s", self.worker_id)
                return 0
            logger.info(
                "Worker started id=%s queues=%s concurrency=%s burst=%s",
                self.worker_id,
                self._queues_text(),
                self.concurrency,
                self.burst,
            )
            self._start_threads()
            while not self._done.is_set() and not self._stopping:
                self._wake.wait(0.1)
                self._wake.clear()
                self._take_signals()
            self._shutdown()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        logger.info(
            "Worker stopped id=%s processed=%s forced=%s",
            self.worker_id,
            self.processed,
            self.forced_exit,
        )
        return 0

    def _start_up(self) -> bool:
        """Check the tables and register this worker, retrying while the database is
        unreachable; False if a stop signal came first. Raises SchemaMissing when the
        database answers but django-gator's tables are not there."""
        if self._retrying("check the tables", self._check_schema, until_stop=True) is None:
            return False
        return self._retrying("register worker", self._register, until_stop=True) is not None

    def _check_schema(self) -> bool:
        missing = schema.missing_tables(self.alias)
        if missing:
            raise SchemaMissing(schema.missing_tables_message(self.alias, missing))
        return True

    def request_stop(self) -> None:
        """Stop claiming; running jobs finish (up to the shutdown timeout)."""
        with self._lock:
            self._stopping = True
            self._fetch_needed.notify_all()
        self._wake.set()

    def force_stop(self) -> None:
        """Stop now: running jobs go back to ``waiting`` and the process exits."""
        self._forced = True
        self.request_stop()
        with self._lock:
            self._fetch_needed.notify_all()

    def _handle_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only counts: a handler runs on the main thread between two of its bytecodes,
        # perhaps while that thread holds a lock, so it takes none (not even an Event's).
        # The main thread turns the count into a stop within 0.1 s (_take_signals).
        self._signals += 1

    def _take_signals(self) -> None:
        """Act on the signals counted by the handler (main thread only)."""
        if self._signals > 1 and not self._forced:
            self.force_stop()
        elif self._signals and not self._stopping:
            self.request_stop()

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, self._handle_signal)
        return previous

    def _register(self) -> bool:
        queues = json.dumps([[s.name, s.weight] for s in self.specs])
        self.engine.register_worker(
            self.worker_id, self.hostname, self.pid, queues, self.concurrency
        )
        return True

    def _start_threads(self) -> None:
        for _ in range(self.concurrency):
            self._spawn_executor()
        if not self.burst and self.engine.can_listen:
            self._listening = True
            self._spawn("gator-listener", self._listen_loop)
        self._spawn("gator-heartbeat", self._heartbeat_loop)
        self._spawn("gator-fetcher", self._fetcher_loop)
        if self.run_scheduler:
            self._spawn("gator-scheduler", self._scheduler_loop)

    def _spawn(self, name: str, target: Callable[[], None]) -> threading.Thread:
        def main() -> None:
            try:
                target()
            except JobTimeout:
                if threading.current_thread() not in self._retired:
                    raise
                # The JobTimeout raised into a timed-out executor arrived after its job
                # had ended; the thread was retiring anyway.
            except BaseException:
                logger.exception("Worker thread crashed thread=%s worker=%s", name, self.worker_id)
                self.force_stop()
            finally:
                connections.close_all()  # this thread's connections

        thread = threading.Thread(target=main, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def _spawn_executor(self) -> threading.Thread:
        self._executor_count += 1
        return self._spawn(f"gator-executor-{self._executor_count}", self._executor_loop)

    def _shutdown(self) -> None:
        with self._lock:
            self._stopping = True
            unstarted = [*self._pending, *self._suspects]
            self._pending.clear()
            self._suspects.clear()
            self._in_flight -= len(unstarted)
            self._closing = True
            self._work_ready.notify_all()
            self._fetch_needed.notify_all()
        if unstarted:
            # Claimed but never started: back to waiting, the attempt not charged.
            self._retrying("release unstarted jobs", functools.partial(self._release, unstarted))
        if not self._done.is_set():
            logger.info(
                "Worker stopping id=%s running=%s timeout=%ss",
                self.worker_id,
                len(self._running),
                self.shutdown_timeout,
            )
        deadline = time.monotonic() + self.shutdown_timeout
        with self._lock:
            while self._running and not self._forced:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._fetch_needed.wait(min(remaining, 0.1))
                if self._signals > 1:  # a second signal: stop waiting for the jobs
                    self._forced = True
            interrupted = [r.job for r in self._running.values()]
        self._stop_background.set()
        for thread in self._threads:
            if thread.name in ("gator-fetcher", "gator-heartbeat"):
                thread.join(timeout=10)
        # Successes the fetcher had not written yet.
        self._flush_succeeded()
        if interrupted:
            self.forced_exit = True
            logger.warning(
                "Worker exiting with jobs still running id=%s jobs=%s",
                self.worker_id,
                ",".join(str(j.id) for j in interrupted),
            )
            self._retrying(
                "release interrupted jobs", functools.partial(self._release, interrupted)
            )
        else:
            for thread in self._threads:
                thread.join(timeout=5)
        try:
            self.engine.unregister_worker(self.worker_id)
        except DatabaseError:
            logger.exception("Could not remove the worker row id=%s", self.worker_id)

    # -- fetcher -----------------------------------------------------------------------
    def _fetcher_loop(self) -> None:
        failures = 0
        idle_wait = MIN_POLL
        while True:
            with self._lock:
                while (
                    not self._stopping
                    and not self._succeeded
                    and not self._notified
                    and not self._timed_out
                    and not self._may_isolate()
                    and (self._in_flight >= self.concurrency or self._holding())
                ):
                    self._fetch_needed.wait(self._watchdog_wait())
                    self._enforce_timeouts()
                stopping = self._stopping
                # No claims while a suspect waits for the others to finish, or runs alone.
                held = bool(self._suspects) or self._isolated is not None
                free = 0 if held else self.concurrency - self._in_flight
                idle = self._in_flight == 0
                self._notified = False
                suspect = self._suspects.popleft() if self._may_isolate() else None
            self._record_timeouts()
            if stopping:
                if suspect is not None:
                    with self._lock:
                        self._suspects.appendleft(suspect)  # released by the shutdown
                self._flush_succeeded()
                return
            with self._lock:
                batch, self._succeeded = self._succeeded, []
            try:
                close_old_connections()
                self.engine.prepare_bookkeeping()
                if failures:
                    self._release_orphans(batch)
                marks = [(job.id, job.attempts, success.result) for job, success, _ in batch]
                jobs, written = self.claimer.claim(max(free, 0), marks)
                failures = 0
            except Exception:
                failures += 1
                logger.exception("Claim failed; retrying worker=%s", self.worker_id)
                _drop_connection(self.alias)
                with self._lock:
                    self._succeeded[:0] = batch  # written next time (marks are idempotent)
                    if suspect is not None:
                        self._suspects.appendleft(suspect)
                self._stop_background.wait(min(0.1 * 2**failures, MAX_BACKOFF))
                continue
            self._report_succeeded(batch, written)
            if suspect is not None:
                # Every success mark is written by now (nothing else was running): a crash
                # from here on takes no finished job down with it.
                self._start_isolated(suspect)
                continue
            if free <= 0:
                continue
            with self._lock:
                stopping = self._stopping
                if jobs and not stopping:
                    self._hand_out(jobs)
                    idle_wait = MIN_POLL
                    continue
                if not jobs and not stopping:
                    if self.burst and idle and self._in_flight == 0 and not self._succeeded:
                        self._done.set()
                        self._wake.set()
                        return
                    if self._listening:
                        wait = self.poll_interval
                    else:
                        wait = idle_wait
                        idle_wait = min(idle_wait * 2, self.poll_interval)
                    if not self._succeeded and not self._notified:
                        self._fetch_needed.wait(min(wait, self._watchdog_wait()))
                    continue
            if jobs:
                # A stop came in while we were claiming: hand these straight back.
                self._retrying("release jobs", functools.partial(self._release, jobs))
            return

    def _holding(self) -> bool:
        """Whether claims wait for a suspect (called with the lock held): one is held
        while other jobs still run, or one runs alone. False once a held suspect may
        start, so that the fetcher wakes up to start it."""
        if self._isolated is not None:
            return True
        return bool(self._suspects) and not self._may_isolate()

    def _may_isolate(self) -> bool:
        """A held suspect may start: nothing else is claimed or running here (lock held)."""
        return (
            bool(self._suspects)
            and self._isolated is None
            and self._in_flight == len(self._suspects)
        )

    def _hand_out(self, jobs: Sequence[ClaimedJob]) -> None:
        """Give claimed jobs to the executors, holding back suspects (lock held)."""
        self._in_flight += len(jobs)
        ordinary = [job for job in jobs if not job.suspect]
        self._suspects.extend(job for job in jobs if job.suspect)
        self._pending.extend(ordinary)
        self._work_ready.notify(len(ordinary))
        if len(ordinary) < len(jobs):
            logger.info(
                "Holding suspects until they can run alone worker=%s ids=%s",
                self.worker_id,
                ",".join(str(job.id) for job in jobs if job.suspect),
            )

    def _start_isolated(self, job: ClaimedJob) -> None:
        """Run a suspect alone: record on its row that this attempt is isolated (so that
        losing this worker now is blamed on it), then hand it to an executor."""
        written = self._retrying(
            f"isolate job {job.id}",
            lambda: self.engine.isolate(self.worker_id, job.id, job.attempts),
        )
        with self._lock:
            if written:
                self._isolated = job
                self._pending.append(job)
                self._work_ready.notify()
                return
            self._in_flight -= 1
            self._fetch_needed.notify()
        if written is False:
            _log_lost(job, "isolated run")
        else:  # a forced stop: hand it back
            self._retrying("release a suspect", functools.partial(self._release, [job]))

    def _release_orphans(self, unmarked: Sequence[tuple[ClaimedJob, Success, float]]) -> None:
        """After a failed claim: give back the jobs it claimed without our knowing.

        A claim can commit and its answer still be lost (the connection dies between the
        COMMIT and the reply). Those rows are ``running`` under our worker id, and as our
        heartbeat goes on nobody would ever rescue them. Only the fetcher claims, so any
        running row of ours that no thread holds is such an orphan; it goes back to
        ``waiting`` with its attempt uncharged, as the job never started."""
        held = self.engine.running_claims(self.worker_id)
        with self._lock:
            known = {job.id for job in self._pending}
            known |= {job.id for job in self._suspects}
            known |= {entry.job.id for entry in self._running.values()}
            known |= {job.id for job in self._timed_out}
            known |= {job.id for job, _, _ in self._succeeded}
        known |= {job.id for job, _, _ in unmarked}  # succeeded, mark not yet written
        orphans = [(job_id, attempts) for job_id, attempts in held if job_id not in known]
        if orphans:
            released = self.engine.release(self.worker_id, orphans)
            logger.warning(
                "Released jobs claimed by a claim whose answer was lost worker=%s ids=%s",
                self.worker_id,
                ",".join(map(str, released)) or "-",
            )

    def _flush_succeeded(self) -> None:
        """Write the success marks that executors handed over, in one statement."""
        with self._lock:
            batch, self._succeeded = self._succeeded, []
        if not batch:
            return
        marks = [(job.id, job.attempts, success.result) for job, success, _ in batch]
        written = self._retrying(
            f"record {len(batch)} successes",
            lambda: self.engine.mark_succeeded(self.worker_id, marks),
        )
        if written is not None:
            self._report_succeeded(batch, written)

    def _report_succeeded(
        self, batch: Sequence[tuple[ClaimedJob, Success, float]], written: Sequence[int]
    ) -> None:
        if not batch:
            return
        written_ids = set(written)
        for job, _success, elapsed_ms in batch:
            if job.id not in written_ids and not self._outcome_landed(job, "succeeded"):
                _log_lost(job, "succeeded")
                continue
            if logger.isEnabledFor(logging.INFO):
                logger.info(
                    "Processed job id=%s name=%s result=succeeded queue=%s attempt=%s "
                    "duration_ms=%.1f",
                    job.id,
                    safe(job.name),
                    safe(job.queue),
                    job.attempts,
                    elapsed_ms,
                )

    # -- timeouts ------------------------------------------------------------------------
    def _watchdog_wait(self) -> float:
        """Seconds until the next job deadline (called with the lock held)."""
        deadlines = [r.deadline for r in self._running.values() if r.deadline is not None]
        if not deadlines:
            return self.poll_interval
        return max(min(deadlines) - time.monotonic(), 0.001)

    def _record_timeouts(self) -> None:
        """Write the outcome of every job the watchdog took over (on the fetcher thread,
        before the next claim, so a burst worker never exits with one unwritten)."""
        with self._lock:
            self._enforce_timeouts()
            expired, self._timed_out = self._timed_out, []
        for job in expired:
            self._record_timeout(job)

    def _enforce_timeouts(self) -> None:
        """Fail jobs that ran past their timeout and give their slot a fresh thread
        (called with the lock held). The stuck thread gets a JobTimeout raised in it, which
        interrupts Python code but not a blocking call; when it finishes, it sees the job
        is no longer its own and writes nothing."""
        now = time.monotonic()
        expired = [r for r in self._running.values() if r.deadline is not None and now > r.deadline]
        for entry in expired:
            del self._running[entry.thread]
            if entry.job is self._isolated:
                self._isolated = None
            self._in_flight -= 1
            self._spawn_executor()
            self._retired.add(entry.thread)
            _interrupt(entry.thread, JobTimeout)
            self._timed_out.append(entry.job)

    def _record_timeout(self, job: ClaimedJob) -> None:
        timeout = get_job_class(job.name).timeout or 0
        exc = JobTimeout(f"job ran longer than its timeout of {timeout:g} s")
        outcome = failure_for(job, self.worker_id, exc)
        elapsed_ms = timeout * 1000
        self._write_failure(job, outcome, elapsed_ms)

    # -- executors -----------------------------------------------------------------------
    def _executor_loop(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                while not self._pending and not self._closing:
                    self._work_ready.wait()
                if not self._pending:
                    return
                job = self._pending.popleft()
                self._running[me] = _Running(job, me, _deadline(job))
            try:
                outcome, elapsed_ms = self._execute(job)
            except BaseException as exc:
                logger.exception("Executor error id=%s", job.id)
                outcome, elapsed_ms = None, 0.0
                self._record_executor_error(job, exc)
            with self._lock:
                entry = self._running.pop(me, None)
                if entry is None:
                    return  # timed out: a fresh thread has this slot; this one retires
                if entry.job is self._isolated:
                    self._isolated = None
                self._in_flight -= 1
                self.processed += 1
                if isinstance(outcome, Success) and outcome.batched:
                    self._succeeded.append((job, outcome, elapsed_ms))
                self._fetch_needed.notify()

    def _execute(self, job: ClaimedJob) -> tuple[Success | Failure, float]:
        """Run the job; write its outcome unless it is a plain success, which the fetcher
        writes in a batch (returned as a Success with ``batched`` set)."""
        close_old_connections()
        _check_health_before_use()
        started = time.perf_counter()
        commit = functools.partial(self._commit_atomic, job)
        try:
            outcome = run_claimed(
                job, self.worker_id, commit, watch=True, atomic=self.engine.atomic_job
            )
        finally:
            elapsed_ms = (time.perf_counter() - started) * 1000
            close_old_connections()
            reset_queries()
        with self._lock:
            timed_out = threading.current_thread() not in self._running
        if timed_out:
            # The watchdog took this job over and writes its JobTimeout outcome; whatever
            # this thread ended with (often the JobTimeout raised into it) is not written.
            return outcome, elapsed_ms
        if isinstance(outcome, Failure):
            self._write_failure(job, outcome, elapsed_ms)
        elif outcome.written is not None:
            self._report_atomic(job, outcome, elapsed_ms)
        elif job.chain_id is not None:
            self._write_chain_success(job, outcome, elapsed_ms)
        else:
            outcome.batched = True
        return outcome, elapsed_ms

    def _commit_atomic(self, job: ClaimedJob, result: str | None) -> bool:
        """An atomic job's success mark (and its chain's next step), written inside the
        transaction that ran handle(); False if the job is no longer ours."""
        following = next_step(job) if job.chain_id is not None else None
        return self.engine.mark_succeeded_and_insert(
            self.worker_id,
            (job.id, job.attempts, result),
            [following] if following is not None else [],
        )

    def _report_atomic(self, job: ClaimedJob, outcome: Success, elapsed_ms: float) -> None:
        if not outcome.written:
            # The mark found the job taken back (rescued, or cancelled by an operator): the
            # job's transaction rolled back, so its effects are undone, and whoever holds
            # the job now decides what happens to it.
            logger.warning(
                "Lost job; its transaction rolled back id=%s name=%s attempt=%s worker=%s",
                job.id,
                safe(job.name),
                job.attempts,
                self.worker_id,
            )
            return
        logger.info(
            "Processed job id=%s name=%s result=succeeded queue=%s attempt=%s duration_ms=%.1f "
            "atomic=yes",
            job.id,
            safe(job.name),
            safe(job.queue),
            job.attempts,
            elapsed_ms,
        )

    def _write_chain_success(self, job: ClaimedJob, outcome: Success, elapsed_ms: float) -> None:
        """A chain step: its success mark and the next step's row in one transaction."""
        following = next_step(job)
        rows = [following] if following is not None else []
        written = self._retrying(
            f"record success of job {job.id}",
            lambda: self.engine.mark_succeeded_and_insert(
                self.worker_id, (job.id, job.attempts, outcome.result), rows
            ),
        )
        if written is None:
            return
        if not written and not self._outcome_landed(job, "succeeded"):
            _log_lost(job, "succeeded")
            return
        logger.info(
            "Processed job id=%s name=%s result=succeeded queue=%s attempt=%s duration_ms=%.1f "
            "chain=%s next=%s",
            job.id,
            safe(job.name),
            safe(job.queue),
            job.attempts,
            elapsed_ms,
            job.chain_id,
            safe(following.name) if following else "-",
        )

    def _record_executor_error(self, job: ClaimedJob, exc: BaseException) -> None:
        """The worker itself failed while finishing ``job`` (writing its outcome, building
        a chain's next step): record that as the attempt's failure, so the job does not
        stay ``running`` under a live worker, where no rescue would ever reach it."""
        with self._lock:
            if threading.current_thread() not in self._running:
                return  # timed out meanwhile: the watchdog writes its outcome
        try:
            self._write_failure(job, failure_for(job, self.worker_id, exc), 0.0)
        except Exception:
            logger.exception("Could not record the failure of job id=%s; it is released", job.id)
            self._retrying("release a job", functools.partial(self._release, [job]))

    def _write_failure(self, job: ClaimedJob, outcome: Failure, elapsed_ms: float) -> None:
        result = outcome_state(outcome, None)
        handler = error_handler(job) if outcome.dead and job.chain_id is not None else None

        def write(failure: Failure) -> bool | None:
            return self._retrying(
                f"record failure of job {job.id}",
                lambda: self.engine.mark_failed_and_insert(
                    self.worker_id, job.id, job.attempts, failure, [handler] if handler else []
                ),
            )

        try:
            written = write(outcome)
        except DatabaseError as exc:
            # The database refused this entry (retrying cannot help): record the failure
            # with an entry that says what was refused instead.
            logger.exception("The failure of job id=%s could not be stored as is", job.id)
            outcome = unstorable_failure(outcome, exc, attempt=job.attempts, worker=self.worker_id)
            written = write(outcome)
        if written is None:
            return
        if not written and not self._outcome_landed(job, result):
            _log_lost(job, result)
            return
        logger.warning(
            "Processed job id=%s name=%s result=%s queue=%s attempt=%s duration_ms=%.1f error=%s",
            job.id,
            safe(job.name),
            result,
            safe(job.queue),
            job.attempts,
            elapsed_ms,
            safe(mask_text(outcome.last_error, secret_values(job.name, job.args, job.kwargs))),
        )

    def _outcome_landed(self, job: ClaimedJob, expected: str) -> bool:
        """After a compare-and-set changed no row: did an earlier try of this very write
        commit (the connection broke before we saw the answer)?"""
        state = self._retrying(f"read job {job.id}", lambda: self.engine.claim_state(job.id))
        if state is None or state[1:] != (job.attempts, self.worker_id):
            return False
        # A failure turns into "cancelled" when a cancellation was asked for.
        return state[0] == expected or (expected != "succeeded" and state[0] == "cancelled")

    def _release(self, jobs: Sequence[ClaimedJob]) -> None:
        released = self.engine.release(self.worker_id, [(j.id, j.attempts) for j in jobs])
        logger.info(
            "Released jobs back to waiting worker=%s ids=%s",
            self.worker_id,
            ",".join(map(str, released)) or "-",
        )

    # -- wakeups -------------------------------------------------------------------------
    def _listen_loop(self) -> None:
        """PostgreSQL: wake the fetcher when a dispatch for one of our queues commits."""
        wanted = {s.name for s in self.specs}
        failures = 0
        while not self._stop_background.is_set():
            try:
                with self.engine.listen() as listener:
                    failures = 0
                    while not self._stop_background.is_set():
                        queues = listener.wait(1.0)
                        if queues and (not wanted or wanted & queues):
                            with self._lock:
                                self._notified = True
                                self._fetch_needed.notify()
            except Exception:
                failures += 1
                logger.warning(
                    "LISTEN connection failed; polling until it is back worker=%s",
                    self.worker_id,
                    exc_info=failures == 1,
                )
                self._stop_background.wait(min(0.1 * 2**failures, MAX_BACKOFF))

    # -- heartbeat and rescue ----------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        interval = conf.heartbeat_interval()
        try:
            self._rescue()  # a worker that died just before we started
        except Exception:
            logger.exception("Rescue failed worker=%s", self.worker_id)
            _drop_connection(self.alias)
        self._last_beat = time.monotonic()
        while not self._stop_background.wait(interval):
            try:
                close_old_connections()
                self.engine.prepare_bookkeeping()
                if not self.engine.heartbeat(self.worker_id):
                    logger.warning(
                        "Worker row was gone (declared lost by another worker); "
                        "registering again id=%s",
                        self.worker_id,
                    )
                    self._register()
                judging = self._may_rescue(time.monotonic())
                if judging or self.engine.workers_share_a_host:
                    self._rescue(judging=judging)
            except Exception:
                logger.exception("Heartbeat failed worker=%s", self.worker_id)
                _drop_connection(self.alias)

    def _may_rescue(self, now: float) -> bool:
        """Note a heartbeat written at ``now`` (time.monotonic()); whether this worker may
        now judge others lost.

        When our own heartbeats stopped for a while (this process was frozen, or the
        database was down, or locked by a stalled writer), the other workers were most
        likely stopped by the same thing, and their heartbeats look lapsed although they
        are alive. They get two heartbeat intervals to write one before we rescue anything:
        a job whose worker is alive must not be run twice. (Where the host can tell, as on
        SQLite, a worker whose process is gone or stopped gets no such time: see _rescue.)"""
        gap = now - self._last_beat
        self._last_beat = now
        if gap > conf.heartbeat_timeout() / 2:
            wait = 2 * conf.heartbeat_interval()
            self._judge_after = now + wait
            logger.warning(
                "No heartbeat for %.1f s (frozen, or the database stalled); rescuing no "
                "other worker's jobs for %.1f s%s worker=%s",
                gap,
                wait,
                " but those of gone or stopped processes on this host"
                if self.engine.workers_share_a_host
                else "",
                self.worker_id,
            )
        return now >= self._judge_after

    def _scheduler_loop(self) -> None:
        """Dispatch the due occurrences of the cron schedules (see worker.scheduler)."""
        from django_gator.worker.scheduler import Scheduler

        scheduler: Scheduler | None = None
        failures = 0
        while not self._stop_background.is_set():
            try:
                close_old_connections()
                if scheduler is None:
                    candidate = Scheduler(self.alias)
                    candidate.sync_declared()
                    scheduler = candidate
                scheduler.tick()
                failures = 0
            except Exception:
                failures += 1
                logger.exception("Scheduler failed; retrying worker=%s", self.worker_id)
                _drop_connection(self.alias)
                self._stop_background.wait(min(0.1 * 2**failures, MAX_BACKOFF))
                continue
            self._stop_background.wait(conf.scheduler_interval())

    def _rescue(self, *, judging: bool = True) -> None:
        """Take back the running jobs of workers whose heartbeat lapsed (every
        ORPHAN_SWEEP_EVERY seconds also those of owners that have no worker row).

        Where all workers share this host (SQLite), the operating system is asked first
        (see worker.liveness): a worker whose process is alive keeps its jobs, its late
        heartbeat most likely waiting for the write lock; one whose process is gone or
        stopped loses them even while we are not ``judging`` (see _may_rescue)."""
        cutoff = self.engine.db_now() - timedelta(seconds=conf.heartbeat_timeout())
        max_rescues = conf.max_rescues()
        verdicts = self._ask_the_host(cutoff)
        if not judging and not {Liveness.GONE, Liveness.STOPPED} & set(verdicts.values()):
            return
        sweep = judging and time.monotonic() - self._last_sweep >= ORPHAN_SWEEP_EVERY
        lost = self.engine.lost_claims(cutoff, sweep=sweep)
        if sweep:
            self._last_sweep = time.monotonic()
        for claim in lost:
            owner = claim.owner or ""
            verdict = verdicts.get(owner, Liveness.UNKNOWN)
            if verdict is Liveness.ALIVE or (not judging and verdict is Liveness.UNKNOWN):
                continue
            dead = claim.isolated and claim.crashes + 1 >= max_rescues
            if not claim.isolated:
                reason = (
                    f"worker {owner} stopped heartbeating while running this job; the job is "
                    "now a suspect, and its next attempts run with no other job beside them, "
                    "so that a crash is blamed only on the job that caused it"
                )
            else:
                reason = (
                    f"worker {owner} stopped heartbeating while this job ran alone in it "
                    f"(crash {claim.crashes + 1} of {max_rescues} allowed)"
                )
                if dead:
                    reason += "; it crashes its worker, so it is a likely poison pill"
            if verdict is not Liveness.UNKNOWN:
                reason += f" (its process on this host is {verdict.value})"
            error, summary = error_entry(
                WorkerLost(reason), attempt=claim.attempts, worker_id=owner, tb=""
            )
            if self.engine.rescue(claim, cutoff, dead=dead, error=error, last_error=summary):
                logger.warning(
                    "Rescued job id=%s from lost worker=%s result=%s isolated=%s",
                    claim.id,
                    safe(owner),
                    "dead" if dead else "waiting",
                    "yes" if claim.isolated else "no",
                )
        if not judging:
            return
        if not self.engine.workers_share_a_host:
            self.engine.forget_workers(cutoff)
            return
        # Only the rows judged here: a live worker's row stays (a write spared, too).
        judged = [owner for owner, verdict in verdicts.items() if verdict is not Liveness.ALIVE]
        if judged:
            self.engine.forget_workers(cutoff, only=judged)

    def _ask_the_host(self, cutoff: datetime) -> dict[str, Liveness]:
        """Where all workers share this host: what the operating system says of each worker
        whose heartbeat lapsed before ``cutoff`` (empty elsewhere)."""
        if not self.engine.workers_share_a_host:
            return {}
        shared_memory = self.engine.shared_memory_file()
        verdicts = {}
        for owner, hostname, pid, started_at in self.engine.lapsed_workers(cutoff):
            if owner == self.worker_id:
                verdicts[owner] = Liveness.ALIVE  # we are; our heartbeat waited
                continue
            verdicts[owner] = local_worker(hostname, pid, started_at, shared_memory)
            if verdicts[owner] is Liveness.ALIVE and owner not in self._spared:
                self._spared.add(owner)
                logger.warning(
                    "Worker's heartbeat lapsed, but its process on this host is alive: its "
                    "jobs stay with it id=%s pid=%s worker=%s",
                    safe(owner),
                    pid,
                    self.worker_id,
                )
        return verdicts

    # -- helpers -----------------------------------------------------------------------
    def _retrying(
        self, what: str, action: Callable[[], T], *, until_stop: bool = False
    ) -> T | None:
        """Run a database operation until it succeeds; the database may be restarting.

        Only errors of the connection or the server (an outage, a lock timeout, a
        deadlock) are retried. A permanent error (the database refused the data or the
        statement: DataError, IntegrityError, ProgrammingError) would fail the same way
        forever, so it is raised at once for the caller to deal with.

        Gives up (returning None) when the worker is being forced to stop, or, with
        ``until_stop``, at the first stop signal; whatever was not written is then rescued
        by another worker after our heartbeat lapses."""
        failures = 0
        while True:
            try:
                return action()
            except TRANSIENT_ERRORS:
                failures += 1
                if self._giving_up(until_stop) and failures > 1:
                    logger.exception("Giving up: %s worker=%s", what, self.worker_id)
                    return None
                logger.warning(
                    "Database error, will retry: %s worker=%s try=%s",
                    what,
                    self.worker_id,
                    failures,
                    exc_info=failures == 1,
                )
                _drop_connection(self.alias)
                pause_until = time.monotonic() + min(0.05 * 2**failures, MAX_BACKOFF)
                while time.monotonic() < pause_until and not self._giving_up(until_stop):
                    time.sleep(min(0.05, max(pause_until - time.monotonic(), 0)))
                if until_stop and self._signals:
                    logger.warning("Stopped while retrying: %s worker=%s", what, self.worker_id)
                    return None

    def _giving_up(self, until_stop: bool) -> bool:
        return self._forced or self._signals > 1 or (until_stop and self._signals > 0)

    def _queues_text(self) -> str:
        if not self.specs:
            return "*"
        return ",".join(f"{s.name}:{s.weight}" for s in self.specs)


def _deadline(job: ClaimedJob) -> float | None:
    try:
        timeout = get_job_class(job.name).timeout
    except JobNotRegistered:
        return None
    return None if timeout is None else time.monotonic() + timeout


def _interrupt(thread: threading.Thread, exc_type: type[BaseException]) -> None:
    """Raise ``exc_type`` in ``thread`` at its next Python instruction (best effort)."""
    if thread.ident is None:
        return
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type)
    )


def _log_lost(job: ClaimedJob, result: str) -> None:
    logger.warning(
        "Job outcome discarded: the claim was lost (rescued or changed meanwhile) "
        "id=%s name=%s result=%s",
        job.id,
        safe(job.name),
        result,
    )


def _drop_connection(alias: str) -> None:
    """Close this thread's connection after an error, so the next use reconnects."""
    try:
        connection = connections[alias]
        if connection.in_atomic_block:
            return
        connection.close()
    except Exception:
        logger.debug("closing a broken connection failed", exc_info=True)


def _check_health_before_use() -> None:
    """Have this thread's open connections checked (one ``SELECT 1``) when the job first
    uses them.

    An executor keeps its connections between jobs, and the server may have closed one
    meanwhile (a restart, a killed backend, an idle timeout). Without the check, the job's
    first query would fail and the job with it, for a fault that is not its own; with it,
    Django reconnects first. It is Django's CONN_HEALTH_CHECKS, switched on for the
    connections a worker keeps open; a job that never touches the database pays nothing."""
    for connection in connections.all(initialized_only=True):
        if connection.connection is not None:
            # Attributes of Django's BaseDatabaseWrapper that django-stubs does not declare.
            connection.health_check_enabled = True  # type: ignore[attr-defined]
            connection.health_check_done = False  # type: ignore[attr-defined]


def _keep_connections_open() -> Callable[[], None]:
    """Give the worker persistent connections, given up by both ends when the network goes
    silent (see worker.connections); returns a function that undoes it."""
    return worker_connections.prepare()
