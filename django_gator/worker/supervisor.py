"""The worker process: it builds the components, starts their threads, turns signals into
a stop, and shuts down.

The components (each constructed and tested on its own):

- :class:`~.slots.Slots`: what the worker holds (claimed, running, finished), one lock;
- :class:`~.fetcher.Fetcher`: the claim loop, with :class:`~.claims.Claimer` choosing
  where to claim;
- :class:`~.executor.Executors`: ``--concurrency`` threads running one job each, and the
  watchdog for timeouts;
- :class:`~.outcomes.Outcomes`: the only writer of an attempt's outcome;
- :class:`~.lifeline.Lifeline`: heartbeats, and the rescue of lost workers' jobs;
- :func:`~.listener.listen` (PostgreSQL) wakes the fetcher on NOTIFY (behind a pooler, on
  ``GATOR_LISTEN_DATABASE``: see :mod:`.pooling`), and :func:`~.listener.receive_wakeups`
  (elsewhere) on a wakeup datagram from dispatch;
- :class:`~.pruner.Pruner` deletes old finished jobs, one worker of the fleet at a time;
- :func:`~.scheduler.run_scheduler` dispatches due cron occurrences;
- :class:`~.retrier.Retrier`: database writes that outlast an outage;
- :class:`~.registration.Registration`: this worker's row (and its wakeup socket);
- :class:`~.threads.WorkerThreads`: the threads running, each with its own connections.

Threads each have their own database connection, as Django gives every thread its own.
Signal handlers only count signals; the main thread acts on the count.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Sequence
from secrets import token_hex
from types import FrameType
from typing import Any

from django_gator import conf
from django_gator.engines import ClaimedJob, get_engine
from django_gator.worker import aio, isolation
from django_gator.worker import connections as worker_connections
from django_gator.worker.beacon import RAN, Beacon
from django_gator.worker.claims import Claimer
from django_gator.worker.executor import Executors
from django_gator.worker.fetcher import Fetcher
from django_gator.worker.lifeline import Lifeline
from django_gator.worker.limits import Limits
from django_gator.worker.listener import listen, receive_wakeups
from django_gator.worker.outcomes import Outcomes
from django_gator.worker.pooling import listen_engine
from django_gator.worker.pruner import Pruner
from django_gator.worker.queues import QueueSpec
from django_gator.worker.registration import Registration
from django_gator.worker.retrier import Retrier
from django_gator.worker.scheduler import run_scheduler
from django_gator.worker.slots import Slots
from django_gator.worker.threads import WorkerThreads

logger = logging.getLogger("django_gator.worker")


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
        limits: Limits | None = None,
        supervisor: str = "",
        async_concurrency: int | None = None,
        beacon: Beacon | None = None,
    ) -> None:
        self.specs = list(queues)
        self.concurrency = _at_least_one("concurrency", concurrency or conf.concurrency())
        self.async_concurrency = _at_least_one(
            "async concurrency", async_concurrency or conf.async_concurrency()
        )
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
        self.hostname = socket.gethostname()
        self.pid = os.getpid()
        self.worker_id = f"{self.hostname}:{self.pid}:{token_hex(4)}"
        self.engine = get_engine(self.alias)

        self._signals = 0  # counted by the signal handler, acted on by the main thread
        self._wake = threading.Event()  # the main thread has something to look at
        self._done = threading.Event()  # a burst worker drained its queues
        self._stop_background = threading.Event()  # fetcher, heartbeat, listener, scheduler
        self.forced_exit = False
        # Recycling (--max-jobs, --max-memory) and the --processes supervisor, if any.
        self.limits = limits or Limits()
        self.supervisor = supervisor
        self.beacon = beacon or Beacon()  # to the supervisor, if any (see .beacon)
        self._ran_reported = False
        self.recycled: str | None = None  # why this worker stopped by itself to recycle
        self.registration = Registration(
            self.engine,
            self.alias,
            self.worker_id,
            specs=self.specs,
            concurrency=self.concurrency,
            supervisor=supervisor,
            hostname=self.hostname,
            pid=self.pid,
        )
        self._assemble(rng)

    def _assemble(self, rng: random.Random | None) -> None:
        """Build the components (see the module docstring), each given what it shares."""
        # The event loop of async jobs (see .aio), if any job class is async.
        loop = aio.any_async_jobs()
        self.slots = Slots(
            self.concurrency, self.async_concurrency, isolation.router(self.specs) if loop else None
        )
        self.slots.budget = self.limits.max_jobs
        self.threads = WorkerThreads(self.slots, self.worker_id, self.force_stop)
        spawn = self.threads.spawn
        self.retrying = Retrier(self.alias, self.worker_id, self._giving_up)
        self.outcomes = Outcomes(self.engine, self.worker_id, self.retrying)
        self.aio = aio.AsyncRunner(self.slots, self.outcomes, spawn) if loop else None
        self.claimer = Claimer(self.engine, self.worker_id, self.specs, rng)
        self.executors = Executors(self.slots, self.outcomes, self.engine, spawn, self.specs)
        burst = self.burst
        self.listen_on = None if burst else listen_engine(self.engine, self.poll_interval)
        self.fetcher = Fetcher(
            engine=self.engine,
            slots=self.slots,
            claimer=self.claimer,
            executors=self.executors,
            outcomes=self.outcomes,
            retrying=self.retrying,
            stopped=self._stop_background,
            poll_interval=self.poll_interval,
            burst=burst,
            listening=self.listen_on is not None,
            on_drained=self._drained,
            start_async=self.aio.submit if self.aio else lambda jobs: None,
        )
        args = (self.engine, self.worker_id, self.registration.register, self.beacon)
        self.lifeline = Lifeline(*args, tally=self.outcomes.tally)
        self.pruner = Pruner(self.engine, self.worker_id, rng) if not burst else None

    @property
    def processed(self) -> int:
        """Jobs this worker has run to an outcome."""
        return self.slots.processed

    # -- lifecycle ---------------------------------------------------------------------------
    def run(self) -> int:
        """Work until stopped (or, with ``burst``, until nothing is due); returns 0."""
        restore = worker_connections.prepare()
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
                if self.registration.wakeup_socket is not None:
                    self.registration.wakeup_socket.close()
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
            while not self._done.is_set() and not self.slots.stopping:
                self._wake.wait(0.1)
                self._wake.clear()
                self._take_signals()
                self._take_limits()
                self._report_first_job()
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
        registration = self.registration
        if self.retrying("check the tables", registration.check_schema, until_stop=True) is None:
            return False
        self._bind_wakeups()
        return self.retrying("register worker", registration.register, until_stop=True) is not None

    def _bind_wakeups(self) -> None:
        """Without LISTEN: a UDP socket that dispatch wakes this worker on (GATOR_WAKEUP_BIND),
        published in its row; the fetcher then needs no quick polls."""
        if self.registration.bind_wakeups(self.burst):
            self.fetcher.listening = True

    def _start_threads(self) -> None:
        self.executors.start(self.concurrency)
        if self.aio is not None:
            self.aio.start()
        stopped = self._stop_background
        if self.listen_on is not None:
            queues = [s.name for s in self.specs]
            self.threads.spawn(
                "gator-listener",
                functools.partial(
                    listen, self.listen_on, self.slots, queues, stopped, self.worker_id
                ),
            )
        if self.pruner is not None and conf.auto_prune():
            self.threads.spawn("gator-pruner", functools.partial(self.pruner.run, stopped.wait))
        wakeup_socket = self.registration.wakeup_socket
        if wakeup_socket is not None:
            queues = [s.name for s in self.specs]
            self.threads.spawn(
                "gator-wakeup",
                functools.partial(receive_wakeups, wakeup_socket, self.slots, queues, stopped),
            )
        self.threads.spawn("gator-heartbeat", functools.partial(self.lifeline.run, stopped.wait))
        self.threads.spawn("gator-fetcher", self.fetcher.run)
        if self.run_scheduler:
            self.threads.spawn(
                "gator-scheduler",
                functools.partial(run_scheduler, self.alias, stopped, self.worker_id),
            )

    def _drained(self) -> None:
        self._done.set()
        self._wake.set()

    # -- stopping ----------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Stop claiming; running jobs finish (up to the shutdown timeout)."""
        self.slots.stop()
        self._wake.set()

    def force_stop(self) -> None:
        """Stop now: running jobs go back to ``waiting`` and the process exits."""
        self.slots.stop(forced=True)
        self._wake.set()

    def _handle_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only counts: a handler runs on the main thread between two of its bytecodes,
        # perhaps while that thread holds a lock, so it takes none (not even an Event's).
        # The main thread turns the count into a stop within 0.1 s (_take_signals).
        self._signals += 1

    def _take_signals(self) -> None:
        """Act on the signals counted by the handler (main thread only)."""
        if self._signals > 1 and not self.slots.forced:
            self.force_stop()
        elif self._signals and not self.slots.stopping:
            self.request_stop()

    def _take_limits(self) -> None:
        """Recycle once a limit is reached (main thread only): no more claims; once every
        claimed job has run, stop. Stop at once if the supervisor is gone."""
        slots = self.slots
        if slots.stopping or not self.limits.active:
            return
        if self.limits.orphaned():
            logger.warning("Supervisor gone; worker stopping id=%s", self.worker_id)
            self.request_stop()
            return
        reason = self.limits.over_memory()
        with slots.lock:
            if reason is None and slots.budget == 0 and self.recycled is None:
                reason = f"max-jobs {self.limits.max_jobs}"
            if reason is not None and self.recycled is None:
                self.recycled = reason
                slots.budget = 0  # no more claims
                slots.fetch_needed.notify()
                logger.info(
                    "Worker recycling: no more claims id=%s reason=%s", self.worker_id, reason
                )
            spent = slots.spent_locked()
        if spent:
            self.request_stop()

    def _report_first_job(self) -> None:
        """Tell the supervisor, once, that this process has run a job to its outcome: it
        got past its start-up, so if it dies now it is started again at once."""
        if not self._ran_reported and self.slots.processed:
            self._ran_reported = True
            self.beacon.send(RAN)

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, self._handle_signal)
        return previous

    def _giving_up(self, until_stop: bool) -> bool:
        return self.slots.forced or self._signals > 1 or (until_stop and self._signals > 0)

    def _shutdown(self) -> None:
        unstarted = self.slots.close()
        if unstarted:
            # Claimed but never started: back to waiting, the attempt not charged.
            self.retrying(
                "release unstarted jobs", functools.partial(self.outcomes.release, unstarted)
            )
        if not self._done.is_set():
            logger.info(
                "Worker stopping id=%s running=%s timeout=%ss",
                self.worker_id,
                len(self.slots.running),
                self.shutdown_timeout,
            )
        interrupted, started = self._wait_for_running(time.monotonic() + self.shutdown_timeout)
        if self.aio is not None:
            self.aio.close(cancel=bool(interrupted))  # interrupted async jobs are given back
        self._stop_background.set()
        for thread in self.threads.running():
            if thread.name in ("gator-fetcher", "gator-heartbeat"):
                thread.join(timeout=10)
        # Successes the fetcher had not written yet.
        self.outcomes.write_batch(self.slots.take_succeeded())
        if interrupted:
            self.forced_exit = True
            logger.warning(
                "Worker exiting with jobs still running id=%s jobs=%s",
                self.worker_id,
                ",".join(str(j.id) for j in interrupted),
            )
            # Running when the worker stopped: counted as hand-backs, and every
            # GATOR_MAX_HANDBACKS-th charges the attempt (Outcomes.hand_back).
            now = time.monotonic()
            self.outcomes.hand_back(
                interrupted, lambda job: (now - started.get(id(job), now)) * 1000
            )
        else:
            for thread in self.threads.running():
                thread.join(timeout=5)
        self.registration.unregister()

    def _wait_for_running(self, deadline: float) -> tuple[list[ClaimedJob], dict[int, float]]:
        """Wait for running jobs to finish until ``deadline`` (time.monotonic()) or a
        forced stop; the jobs still running then, and when (time.monotonic()) each one
        in an executor thread started, by id() of the job."""
        slots = self.slots
        with slots.lock:
            while (slots.running or slots.async_slots.running) and not slots.forced:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                slots.fetch_needed.wait(min(remaining, 0.1))
                if self._signals > 1:  # a second signal: stop waiting for the jobs
                    slots.forced = True
            jobs = [entry.job for entry in slots.running.values()] + list(
                slots.async_slots.running.values()
            )
            return jobs, {id(entry.job): entry.started for entry in slots.running.values()}

    def _queues_text(self) -> str:
        if not self.specs:
            return "*"
        return ",".join(f"{s.name}:{s.weight}" for s in self.specs)


def _at_least_one(what: str, value: int) -> int:
    if value < 1:
        raise ValueError(f"{what} must be at least 1, got {value}")
    return value
