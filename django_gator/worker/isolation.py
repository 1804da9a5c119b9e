"""Process isolation: an attempt of a job class with ``isolation = "process"`` (or of any job
of a queue given to ``gator_worker --isolate-queue``) runs in a child process of its own,
so that a segfault, an ``os._exit()``, a memory limit or a C call that never returns ends
that attempt alone: the worker, its other jobs and its threads go on.

**How children are made.** A worker's executor threads are many (16 is common) and hold
database connections, so forking the worker itself is unsafe: a lock held by another
thread at the fork (the logging module's, the allocator's, a driver's) stays held forever
in the child. Spawning a fresh interpreter per job is safe but pays Django's start-up
(hundreds of milliseconds of CPU) per job. So children come from a *fork server*
(``multiprocessing``'s ``forkserver``): one clean process per worker, started from a fresh
interpreter the first time a job is isolated, which sets Django up once (the module
``isolation_boot``), opens no connection and runs no thread; each attempt is a fork of it,
which starts with every job module imported and costs some 10 to 40 ms of start and exit
(against about a second for a fresh interpreter). See
docs/benchmarks.md for the cost per job against threads.

**What crosses the boundary.** The worker sends the claimed job, its database settings and
the capture settings; the child runs the attempt (see :mod:`.isolated_child`) and sends
its journal writes (progress, checkpoint, captured logs: the worker writes them on the
claim, as for its own threads, and answers), its checkpoint read, signs of life for the
stall watch, and at last the outcome (result or error, the retry decided there). The
worker writes the outcome as for any attempt.

**When the child dies.** If the pipe ends without an outcome, the attempt fails with
:class:`IsolatedProcessDied`, whose message says how the child ended (the signal, by number
and name, or the exit code), its ``memory_limit`` and the peak memory it last reported;
the job's retry policy applies. No rescue: the worker is alive and writes the failure
itself. A timeout or a stall kills the child (SIGKILL) and fails the attempt as for a
thread. A child never outlives its worker: on Linux it dies with the fork server, which
ends with the worker; everywhere, the worker kills its live children as it exits.
"""

from __future__ import annotations

import atexit
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable, Collection
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from typing import Any

from django.db import connections

from django_gator.attempts import Outcome
from django_gator.engines import ClaimedJob
from django_gator.exceptions import IsolatedProcessDied, JobNotRegistered
from django_gator.longjobs import Journal
from django_gator.queueable import get_job_class
from django_gator.worker.execution import failure_for
from django_gator.worker.isolated_child import child_main
from django_gator.worker.queues import QueueSpec

#: Seconds between two looks at the worker's stop flag and the child's life.
POLL = 0.1
#: Seconds a finished child gets to exit before it is killed.
JOIN_TIMEOUT = 5.0
#: The module the fork server imports before it forks: it sets Django up.
BOOT_MODULE = "django_gator.worker.isolation_boot"

_lock = threading.Lock()
_context: ForkServerContext | None = None
_live: set[Any] = set()  # the children running now


def fork_server() -> ForkServerContext:
    """The ``forkserver`` context whose server sets Django up once (started on first use)."""
    global _context
    with _lock:
        if _context is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload([BOOT_MODULE])
            atexit.register(kill_children)
            _context = context
        return _context


def isolates(job: ClaimedJob, queues: Collection[str]) -> bool:
    """Whether ``job`` runs in a child process: its class says so, or its queue is one of
    ``queues`` (``--isolate-queue``). False for an unknown name (its failure is written
    by the worker, as for any job)."""
    try:
        job_class = get_job_class(job.name)
    except JobNotRegistered:
        return False
    return job_class.isolation == "process" or job.queue in queues


def router(specs: Collection[QueueSpec]) -> Callable[[ClaimedJob], bool]:
    """Whether a job runs on the worker's event loop: an async job that is not isolated (an
    isolated one runs in a child, from an executor thread, like a sync one)."""
    queues = frozenset(s.name for s in specs if s.isolated)

    def runs_async(job: ClaimedJob) -> bool:
        try:
            job_class = get_job_class(job.name)
        except JobNotRegistered:
            return False
        return job_class.traits.is_async and not isolates(job, queues)

    return runs_async


def run_isolated(
    job: ClaimedJob, worker_id: str, journal: Journal, *, stopping: Callable[[], bool]
) -> Outcome:
    """Run one attempt of ``job`` in a child process, relaying its journal; its outcome, or
    the failure that says how the child died. The watchdog's JobTimeout or JobStalled,
    raised into this thread, kills the child (and the watchdog writes that failure)."""
    job_class = get_job_class(job.name)
    context = fork_server()
    capture = journal.logs
    journal.logs = None  # the records are the child's: it captures them
    payload = {
        "job": job,
        "worker_id": worker_id,
        "databases": {c.alias: dict(c.settings_dict) for c in connections.all()},
        "interval": journal.interval,
        "memory_limit": job_class.memory_limit,
        "cpu_limit": job_class.cpu_limit,
        "capture": None
        if capture is None
        else (capture.level, capture.max_lines, capture.max_bytes),
    }
    started = time.monotonic()
    child: Any = None
    ours: Connection | None = None
    try:
        ours, theirs = context.Pipe()
        child = context.Process(
            target=child_main, args=(theirs, payload), name=f"gator-job-{job.id}"
        )
        _live.add(child)
        child.start()
        theirs.close()
        journal.touch()  # the stall watch counts from the child's start
        talk = Conversation(ours, child, journal, stopping)
        outcome = talk.run()
        child.join(JOIN_TIMEOUT)
    except BaseException as exc:  # the watchdog's JobTimeout or JobStalled, raised here
        return failure_for(job, worker_id, exc, time.monotonic() - started)
    finally:
        if child is not None:
            kill(child)
        if ours is not None:
            ours.close()
    if outcome is not None:
        return outcome
    died = IsolatedProcessDied(
        death_message(child.exitcode, job_class.memory_limit, talk.peak, job_class.cpu_limit)
    )
    return failure_for(job, worker_id, died, time.monotonic() - started)


class Conversation:
    """The worker's side of the pipe while a child runs an attempt."""

    def __init__(
        self, conn: Connection, child: Any, journal: Journal, stopping: Callable[[], bool]
    ) -> None:
        self.conn = conn
        self.child = child
        self.journal = journal
        self.stopping = stopping
        self.told_stop = False
        #: The child's peak resident memory (KiB) as it last reported it.
        self.peak: int | None = None

    def run(self) -> Outcome | None:
        """Answer the child until it sends its outcome (returned) or dies (None)."""
        while True:
            if not self.told_stop and self.stopping():
                self.told_stop = True
                if not self._send(("stop",)):
                    return None
            if not self.conn.poll(POLL):
                if self.child.is_alive() or self.conn.poll(0):
                    continue
                return None
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                return None
            kind = message[0]
            if kind == "outcome":
                self.peak = message[2]
                return message[1]
            if kind == "alive":
                self.peak = message[2]
                if message[1]:
                    self.journal.touch()
            elif kind == "write":
                if not self._send(("written", self.journal.relay(*message[1:]))):
                    return None
            elif kind == "load" and not self._send(("checkpoint", self.journal.read())):
                return None

    def _send(self, message: tuple[Any, ...]) -> bool:
        try:
            self.conn.send(message)
        except (OSError, ValueError):  # the child is gone
            return False
        return True


def death_message(
    code: int | None,
    memory_limit: int | None,
    peak_kib: int | None,
    cpu_limit: int | None = None,
) -> str:
    """What an isolated attempt's child died of, for its error entry."""
    cause = ""
    if code is None:
        how = "did not end"
    elif code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown"
        how = f"was killed by signal {-code} ({name})"
        if -code in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGABRT):
            cause = "a crash in native code"
        elif -code == signal.SIGXCPU:
            cause = f"it used up its cpu_limit of {cpu_limit} s of CPU time"
        elif -code == signal.SIGKILL and cpu_limit is not None:
            cause = "its cpu_limit's hard limit, the out-of-memory killer, or a kill -9"
        elif -code == signal.SIGKILL:
            cause = "the kernel's out-of-memory killer, or a kill -9"
    else:
        how = f"exited with code {code}"
        cause = "os._exit(), or an exit in native code"
    parts = [f"the isolated process of this attempt {how} before the attempt ended"]
    if cause:
        parts[0] += f" ({cause})"
    if memory_limit is not None:
        parts.append(f"memory_limit {memory_limit} MiB")
    if peak_kib is not None:
        parts.append(f"peak memory {peak_kib / 1024:.0f} MiB when last reported")
    return "; ".join(parts)


def kill(child: Any) -> None:
    """SIGKILL ``child`` if it still runs, and reap it."""
    if child.pid is not None:  # started
        if child.is_alive():
            child.kill()
        child.join(JOIN_TIMEOUT)
    _live.discard(child)


def kill_children() -> None:
    """Kill the children still running (the worker exits)."""
    for child in list(_live):
        kill(child)
