"""The child side of an isolated attempt (see :mod:`.isolation`): a process forked from the
worker's fork server that runs one attempt of one job and exits.

The child runs the attempt as an executor thread would (:func:`~.execution.run_claimed`:
middleware, signals, ``on_error()``, the retry decision), with a :class:`Journal` whose
writes and checkpoint read travel to the worker over the pipe: the worker writes them on
the claim, as it does for its own threads, and answers. Its captured log lines are built
here (its records are here) and travel with its last write. What it sends, in order:

- ``("write", progress, checkpoint, logs)``: a journal write (answered ``("written", ok)``);
- ``("load",)``: the checkpoint this attempt starts from (answered ``("checkpoint", text)``);
- ``("alive", touched, peak_kib)``: every ALIVE_EVERY seconds, whether a progress,
  checkpoint or heartbeat call came since the last one (for the worker's stall watch) and
  the child's peak resident memory so far (never answered);
- ``("outcome", outcome, peak_kib)``: the attempt's outcome and the child's peak resident
  memory; then it exits.

The worker may send ``("stop",)`` at any time: it is stopping, so ``each()`` hands the job
back at the next item.
"""

from __future__ import annotations

import ctypes
import dataclasses
import pickle
import resource
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from django.db import connections

from django_gator.attempts import Failure, Outcome
from django_gator.exceptions import GatorError, MemoryLimitExceeded
from django_gator.joblogs import LogBuffer, install
from django_gator.longjobs import Journal
from django_gator.queueable import get_job_class
from django_gator.redaction import secret_values
from django_gator.rows import ClaimedJob
from django_gator.validation import dumps
from django_gator.worker.execution import run_claimed

#: Seconds between two "alive" messages.
ALIVE_EVERY = 0.25
PR_SET_PDEATHSIG = 1
MIB = 1024 * 1024


class Parent:
    """The pipe to the worker, from the child's side: requests and their answers, and the
    worker's stop message whenever it comes."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()  # the alive thread sends too
        self.stopping = False

    def send(self, message: tuple[Any, ...]) -> None:
        with self.lock:
            self.conn.send(message)

    def ask(self, message: tuple[Any, ...]) -> Any:
        self.send(message)
        while True:
            answer = self.conn.recv()
            if answer[0] == "stop":
                self.stopping = True
                continue
            return answer[1]

    def stop_asked(self) -> bool:
        while not self.stopping and self.conn.poll(0):
            if self.conn.recv()[0] == "stop":
                self.stopping = True
        return self.stopping


def child_main(conn: Connection, payload: dict[str, Any]) -> None:
    """The child process: run the attempt described by ``payload`` and report it."""
    die_with_parent()
    parent = Parent(conn)
    job: ClaimedJob = payload["job"]
    for alias, settings_dict in payload["databases"].items():
        if alias in connections.settings:
            connections[alias].settings_dict.update(settings_dict)
        else:  # an alias the worker's process added after the fork server started
            connections.settings[alias] = dict(settings_dict)
    limit = payload["memory_limit"]
    if limit is not None:
        resource.setrlimit(resource.RLIMIT_AS, (limit * MIB, limit * MIB))
        guard_memory(job, limit)
    seconds = payload["cpu_limit"]
    if seconds is not None:
        # SIGXCPU at the soft limit (it ends the process), SIGKILL a second later.
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))
    journal = child_journal(parent, job, payload)
    beat = threading.Thread(target=alive, args=(parent, journal), daemon=True)
    beat.start()
    try:
        outcome = run_claimed(job, payload["worker_id"], None, journal=journal)
    finally:
        connections.close_all()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    parent.send(("outcome", sendable(outcome), peak))
    conn.close()


def child_journal(parent: Parent, job: ClaimedJob, payload: dict[str, Any]) -> Journal:
    """A journal whose writes and read go to the worker."""
    capture = payload["capture"]
    buffer = None
    if capture is not None:
        level, lines, size = capture
        buffer = LogBuffer(level, max_lines=lines, max_bytes=size)
        install()

    def log_entry() -> str:
        assert buffer is not None
        secrets = secret_values(job.name, job.args, job.kwargs)
        entry = buffer.entry(attempt=job.attempts, worker=payload["worker_id"], secrets=secrets)
        return dumps(entry)

    def write(progress: str | None, checkpoint: str | None, logs: str | None) -> bool:
        return bool(parent.ask(("write", progress, checkpoint, logs)))

    return Journal(
        write,
        lambda: parent.ask(("load",)),
        interval=payload["interval"],
        stopping=parent.stop_asked,
        logs=buffer,
        log_entry=log_entry,
    )


def alive(parent: Parent, journal: Journal) -> None:
    """Every ALIVE_EVERY seconds, tell the worker whether the job showed signs of life
    (its stall watch is there) and the peak memory of this process so far."""
    seen = journal.active_at
    while True:
        time.sleep(ALIVE_EVERY)
        touched, seen = journal.active_at != seen, journal.active_at
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            parent.send(("alive", touched, peak))
        except (OSError, ValueError):
            return


def guard_memory(job: ClaimedJob, limit: int) -> None:
    """Make a MemoryError of the job's a :class:`MemoryLimitExceeded` that names the limit
    (a middleware of its class, in this process only)."""

    def guard(instance: Any, call_next: Any) -> Any:
        try:
            return call_next()
        except MemoryError as exc:
            raise MemoryLimitExceeded(
                f"the attempt exceeded its memory_limit of {limit} MiB (address space, "
                f"RLIMIT_AS): MemoryError {exc}".rstrip(": ")
            ) from None

    job_class = get_job_class(job.name)
    job_class.middleware = (guard, *job_class.middleware)


def sendable(outcome: Outcome) -> Outcome:
    """``outcome`` as it can cross the pipe: its exception (used for signals, which ran
    here) left out, or replaced, when it cannot be pickled and unpickled (an exception
    class whose ``__init__`` does not take its ``args`` back)."""
    exception = getattr(outcome, "exception", None)
    if exception is None:
        return outcome
    try:
        pickle.loads(pickle.dumps(exception))  # noqa: S301 - our own bytes, round-tripped
    except Exception:
        if isinstance(outcome, Failure):
            return dataclasses.replace(outcome, exception=None)
        return dataclasses.replace(outcome, exception=GatorError(str(exception)))  # type: ignore[arg-type]
    return outcome


def die_with_parent() -> None:
    """On Linux, have the kernel kill this child when its parent (the fork server, which
    ends with the worker) ends: no attempt outlives its worker."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
