"""The worker process: threads, signals, heartbeats, rescue and shutdown.

Threads (each with its own database connection, as Django gives every thread its own):

- the *fetcher* claims up to as many jobs as there are free executor slots, in one statement
  per queue, trying the queues in weighted random order;
- *executors* (``--concurrency`` of them) run one job at a time and write its outcome;
- the *heartbeat* thread refreshes this worker's row and rescues the jobs of workers whose
  heartbeat lapsed.

Signal handlers only set flags; the main thread does the shutdown.
"""

from __future__ import annotations

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
from datetime import timedelta
from secrets import token_hex
from types import FrameType
from typing import Any, TypeVar

from django.db import (
    DatabaseError,
    InterfaceError,
    close_old_connections,
    connections,
    reset_queries,
)

from django_gator import conf
from django_gator.engines import ClaimedJob, get_engine
from django_gator.engines.base import Failure
from django_gator.exceptions import WorkerLost
from django_gator.logutil import safe
from django_gator.worker.execution import Success, error_entry, run_claimed
from django_gator.worker.queues import QueueSpec, weighted_order

logger = logging.getLogger("django_gator.worker")

T = TypeVar("T")
#: How long the all-queues mode trusts its list of queues with ready work.
QUEUE_LIST_TTL = 2.0
#: Longest pause between two tries of a write while the database is unreachable.
MAX_BACKOFF = 5.0


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
        self.install_signal_handlers = install_signal_handlers
        self.rng = rng or random.Random()
        self.hostname = socket.gethostname()
        self.pid = os.getpid()
        self.worker_id = f"{self.hostname}:{self.pid}:{token_hex(4)}"
        self.engine = get_engine(self.alias)

        self._cond = threading.Condition()
        self._pending: deque[ClaimedJob] = deque()
        self._running: dict[int, ClaimedJob] = {}
        self._in_flight = 0
        self._stopping = False  # no more claims
        self._closing = False  # executors exit once the pending queue is empty
        self._forced = False
        self._signals = 0
        self._wake = threading.Event()
        self._done = threading.Event()
        self._heartbeat_stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._queue_cache: tuple[float, list[str]] = (0.0, [])
        self.processed = 0
        self.forced_exit = False

    # -- lifecycle ---------------------------------------------------------------------
    def run(self) -> int:
        """Work until stopped (or, with ``burst``, until nothing is due); returns 0."""
        restore = _keep_connections_open()
        try:
            return self._run()
        finally:
            for alias, max_age in restore.items():
                connections.settings[alias]["CONN_MAX_AGE"] = max_age

    def _run(self) -> int:
        self._retrying("register worker", self._register)
        previous = self._install_signals() if self.install_signal_handlers else {}
        logger.info(
            "Worker started id=%s queues=%s concurrency=%s burst=%s",
            self.worker_id,
            self._queues_text(),
            self.concurrency,
            self.burst,
        )
        try:
            self._start_threads()
            self._rescue()
            while not self._done.is_set() and not self._stopping:
                self._wake.wait(0.5)
                self._wake.clear()
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

    def request_stop(self) -> None:
        """Stop claiming; running jobs finish (up to the shutdown timeout)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._wake.set()

    def force_stop(self) -> None:
        """Stop now: running jobs go back to ``waiting`` and the process exits."""
        self._forced = True
        self.request_stop()

    def _handle_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals == 1:
            self.request_stop()
        else:
            self.force_stop()

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, self._handle_signal)
        return previous

    def _register(self) -> None:
        queues = json.dumps([[s.name, s.weight] for s in self.specs])
        self.engine.register_worker(
            self.worker_id, self.hostname, self.pid, queues, self.concurrency
        )

    def _start_threads(self) -> None:
        for index in range(self.concurrency):
            self._spawn(f"gator-executor-{index}", self._executor_loop)
        self._spawn("gator-fetcher", self._fetcher_loop)
        self._heartbeat_thread = self._spawn("gator-heartbeat", self._heartbeat_loop)

    def _spawn(self, name: str, target: Callable[[], None]) -> threading.Thread:
        def main() -> None:
            try:
                target()
            finally:
                connections.close_all()  # this thread's connections

        thread = threading.Thread(target=main, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def _shutdown(self) -> None:
        with self._cond:
            self._stopping = True
            unstarted = list(self._pending)
            self._pending.clear()
            self._in_flight -= len(unstarted)
            self._closing = True
            self._cond.notify_all()
        if unstarted:
            # Claimed but never started: back to waiting, the attempt not charged.
            self._retrying("release unstarted jobs", lambda: self._release(unstarted))
        if not self._done.is_set():
            logger.info(
                "Worker stopping id=%s running=%s timeout=%ss",
                self.worker_id,
                len(self._running),
                self.shutdown_timeout,
            )
        deadline = time.monotonic() + self.shutdown_timeout
        with self._cond:
            while self._running and not self._forced:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(min(remaining, 0.2))
            interrupted = list(self._running.values())
        if interrupted:
            self.forced_exit = True
            logger.warning(
                "Worker exiting with jobs still running id=%s jobs=%s",
                self.worker_id,
                ",".join(str(j.id) for j in interrupted),
            )
            self._retrying("release interrupted jobs", lambda: self._release(interrupted))
        self._heartbeat_stop.set()
        for thread in self._threads:
            if thread.name.startswith("gator-executor") and interrupted:
                continue  # still inside user code; the process exits without them
            thread.join(timeout=5)
        try:
            self.engine.unregister_worker(self.worker_id)
        except DatabaseError:
            logger.exception("Could not remove the worker row id=%s", self.worker_id)

    # -- fetcher -----------------------------------------------------------------------
    def _fetcher_loop(self) -> None:
        failures = 0
        while True:
            with self._cond:
                if self._stopping:
                    return
                free = self.concurrency - self._in_flight
                if free <= 0:
                    self._cond.wait(self.poll_interval)
                    continue
                idle = self._in_flight == 0
            try:
                close_old_connections()
                jobs = self._claim(free)
                failures = 0
            except Exception:
                failures += 1
                logger.exception("Claim failed; retrying worker=%s", self.worker_id)
                _drop_connection(self.alias)
                time.sleep(min(0.1 * 2**failures, MAX_BACKOFF))
                continue
            with self._cond:
                stopping = self._stopping
                if jobs and not stopping:
                    self._pending.extend(jobs)
                    self._in_flight += len(jobs)
                    self._cond.notify_all()
                    continue
                if not jobs and not stopping:
                    if self.burst and idle and self._in_flight == 0:
                        self._done.set()
                        self._wake.set()
                        return
                    self._cond.wait(self.poll_interval)
                    continue
            if jobs:
                # A stop came in while we were claiming: hand these straight back.
                self._retrying("release jobs", functools.partial(self._release, jobs))
            return

    def _claim(self, limit: int) -> list[ClaimedJob]:
        names = self._queue_order()
        claimed: list[ClaimedJob] = []
        for name in names:
            claimed += self.engine.claim(self.worker_id, name, limit - len(claimed))
            if len(claimed) >= limit:
                break
        if not claimed and not self.specs:
            self._queue_cache = (0.0, [])  # look for new queues next time
        return claimed

    def _queue_order(self) -> list[str]:
        if self.specs:
            return weighted_order(self.specs, self.rng)
        fetched_at, names = self._queue_cache
        if time.monotonic() - fetched_at > QUEUE_LIST_TTL:
            names = self.engine.ready_queues()
            self._queue_cache = (time.monotonic(), names)
        names = list(names)
        self.rng.shuffle(names)
        return names

    # -- executors -----------------------------------------------------------------------
    def _executor_loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending:
                    return
                job = self._pending.popleft()
                self._running[job.id] = job
            try:
                self._execute(job)
            except BaseException:
                logger.exception("Executor error id=%s", job.id)
            finally:
                with self._cond:
                    self._running.pop(job.id, None)
                    self._in_flight -= 1
                    self.processed += 1
                    self._cond.notify_all()

    def _execute(self, job: ClaimedJob) -> None:
        close_old_connections()
        started = time.perf_counter()
        outcome = run_claimed(job, self.worker_id)
        elapsed_ms = (time.perf_counter() - started) * 1000
        try:
            close_old_connections()
            written = self._retrying(
                f"record outcome of job {job.id}", lambda: self._record(job, outcome)
            )
        finally:
            reset_queries()
        if written is None:
            return
        if isinstance(outcome, Success):
            result = "succeeded"
        else:
            result = "dead" if outcome.dead else "failed"
        if not written:
            logger.warning(
                "Job outcome discarded: the claim was lost (rescued or changed meanwhile) "
                "id=%s name=%s result=%s",
                job.id,
                safe(job.name),
                result,
            )
            return
        log = logger.info if result == "succeeded" else logger.warning
        log(
            "Processed job id=%s name=%s result=%s queue=%s attempt=%s duration_ms=%.1f%s",
            job.id,
            safe(job.name),
            result,
            job.queue,
            job.attempts,
            elapsed_ms,
            "" if isinstance(outcome, Success) else f" error={safe(outcome.last_error)}",
        )

    def _record(self, job: ClaimedJob, outcome: Success | Failure) -> bool:
        if isinstance(outcome, Success):
            written = bool(
                self.engine.mark_succeeded(self.worker_id, [(job.id, job.attempts, outcome.result)])
            )
            expected = "succeeded"
        else:
            written = self.engine.mark_failed(self.worker_id, job.id, job.attempts, outcome)
            expected = "dead" if outcome.dead else "failed"
        if written:
            return True
        # Zero rows: either an earlier try of this same write did commit (the connection
        # broke before we saw the answer), or the claim is no longer ours.
        state = self.engine.claim_state(job.id)
        return (
            state is not None
            and state[0] == expected
            and state[1:]
            == (
                job.attempts,
                self.worker_id,
            )
        )

    def _release(self, jobs: Sequence[ClaimedJob]) -> None:
        released = self.engine.release(self.worker_id, [(j.id, j.attempts) for j in jobs])
        logger.info(
            "Released jobs back to waiting worker=%s ids=%s",
            self.worker_id,
            ",".join(map(str, released)) or "-",
        )

    # -- heartbeat and rescue ----------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        interval = conf.heartbeat_interval()
        while not self._heartbeat_stop.wait(interval):
            try:
                close_old_connections()
                if not self.engine.heartbeat(self.worker_id):
                    logger.warning(
                        "Worker row was gone (declared lost by another worker); "
                        "registering again id=%s",
                        self.worker_id,
                    )
                    self._register()
                self._rescue()
            except Exception:
                logger.exception("Heartbeat failed worker=%s", self.worker_id)
                _drop_connection(self.alias)

    def _rescue(self) -> None:
        """Take back the running jobs of workers whose heartbeat lapsed."""
        cutoff = self.engine.db_now() - timedelta(seconds=conf.heartbeat_timeout())
        max_rescues = conf.max_rescues()
        for job_id, attempts, owner, rescues in self.engine.lost_claims(cutoff):
            dead = rescues + 1 >= max_rescues
            reason = f"worker {owner} stopped heartbeating while running this job" + (
                f"; rescued {rescues + 1} times, so it is a likely poison pill" if dead else ""
            )
            error, summary = error_entry(
                WorkerLost(reason), attempt=attempts, worker_id=owner or "", tb=""
            )
            if self.engine.rescue(
                job_id, attempts, owner, cutoff, dead=dead, error=error, last_error=summary
            ):
                logger.warning(
                    "Rescued job id=%s from lost worker=%s result=%s",
                    job_id,
                    safe(owner),
                    "dead" if dead else "waiting",
                )
        self.engine.forget_workers(cutoff)

    # -- helpers -----------------------------------------------------------------------
    def _retrying(self, what: str, action: Callable[[], T]) -> T | None:
        """Run a database write until it succeeds; the database may be restarting.

        Gives up (returning None) only when the worker is being forced to stop; whatever
        was not written is then rescued by another worker after our heartbeat lapses."""
        failures = 0
        while True:
            try:
                return action()
            except (DatabaseError, InterfaceError):
                failures += 1
                if self._forced and failures > 1:
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
                time.sleep(min(0.05 * 2**failures, MAX_BACKOFF))

    def _queues_text(self) -> str:
        if not self.specs:
            return "*"
        return ",".join(f"{s.name}:{s.weight}" for s in self.specs)


def _drop_connection(alias: str) -> None:
    """Close this thread's connection after an error, so the next use reconnects."""
    try:
        connection = connections[alias]
        if connection.in_atomic_block:
            return
        connection.close()
    except Exception:
        logger.debug("closing a broken connection failed", exc_info=True)


def _keep_connections_open() -> dict[str, Any]:
    """Give the worker persistent connections.

    ``close_old_connections()`` runs around every job; with ``CONN_MAX_AGE = 0`` (Django's
    default, right for web requests) it would reconnect for every job. Workers keep each
    connection for ``GATOR_WORKER_CONN_MAX_AGE`` seconds instead; broken connections are
    still dropped and replaced."""
    max_age = conf.get("GATOR_WORKER_CONN_MAX_AGE")
    changed = {}
    for alias in connections:
        settings_dict = connections.settings[alias]
        if settings_dict.get("CONN_MAX_AGE", 0) == 0:
            changed[alias] = settings_dict.get("CONN_MAX_AGE", 0)
            settings_dict["CONN_MAX_AGE"] = max_age
    return changed
