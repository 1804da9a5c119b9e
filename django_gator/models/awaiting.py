"""Waiting for an end: ``Job.wait_result()`` / ``await_result()`` and
``WorkflowRun.wait_result()`` / ``await_result()``.

On PostgreSQL the waiter is woken (django_gator/endwatch.py): its first read flags the row
it waits for (``awaited``; a workflow's open steps) and returns its state, and triggers
NOTIFY when a flagged row ends, at the commit of whichever statement ended it
(django_gator/engines/ends.py). One LISTEN connection per process serves every waiter;
the waiter reads again on each notification meant for it, and every
:data:`FALLBACK_PAUSE` in case one was lost. The flag and the write of the end lock the
same row, so one sees the other: an end that committed first is returned by the flag
itself. A row nobody waits for is written as before: no NOTIFY, only the triggers' WHEN
test of its NULL flag.

Elsewhere (SQLite, MySQL/MariaDB: their wakeup datagrams go to workers, not to waiters),
and on PostgreSQL while the LISTEN connection is down or behind a transaction pooler with
no direct GATOR_LISTEN_DATABASE, the waiter reads the job's state (one primary-key read
of one column), and while the job has not ended reads again after a pause that starts at
:data:`FIRST_PAUSE` and doubles up to :data:`LONGEST_PAUSE`: a job that ends after the
first second is seen at most ``LONGEST_PAUSE`` (plus one read) after its final state
commits. A process that waits pays ``1 / LONGEST_PAUSE`` reads a second there; the
workers pay nothing. The result (which may be large) is read once, when the state says
the job has ended.

A workflow is read the same way: whether any of its steps is still blocked or released
(one indexed read), then once, its steps and the results of its leaves.

Waiting inside ``transaction.atomic()`` on the job database is refused (once the first
read shows the job has not ended; that read flags nothing, as a flag would hold the row's
lock until the transaction ends): a job dispatched in that transaction is not committed,
so no worker can run it, and a REPEATABLE READ snapshot (MariaDB's default) would never
see its end.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections

from django_gator import conf
from django_gator.encryption import open_value
from django_gator.exceptions import GatorError, JobFailed, ResultTimeout, WorkflowFailed
from django_gator.states import FINAL_STATES, JobState, StepState

if TYPE_CHECKING:
    from django_gator.endwatch import EndWatch
    from django_gator.models.jobs import Job
    from django_gator.models.workflows import WorkflowRun

#: Seconds before the second read of a job that has not ended.
FIRST_PAUSE = 0.005
#: The longest pause between two reads: the most a waiter lags behind an end (plus a read).
LONGEST_PAUSE = 0.05
#: Seconds between two reads of a waiter that is woken by notifications (PostgreSQL):
#: the most it lags behind an end whose notification was lost.
FALLBACK_PAUSE = 1.0

#: The watch of an alias's ends (django_gator.endwatch.watch, installed by the wiring), or
#: None where waiters read.
watcher: Callable[[str], EndWatch | None] | None = None


def set_watcher(function: Callable[[str], EndWatch | None]) -> None:
    global watcher
    watcher = function


def watcher_installed() -> bool:
    return watcher is not None


T = TypeVar("T")


def seconds(timeout: timedelta | float | None) -> float | None:
    """``timeout`` as seconds (None: no limit); a clear error for anything else."""
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        value = timeout.total_seconds()
    elif isinstance(timeout, int | float) and not isinstance(timeout, bool):
        value = float(timeout)
    else:
        raise TypeError(
            f"timeout must be seconds (a number or a timedelta) or None, got {timeout!r}"
        )
    if math.isnan(value) or value < 0:
        raise ValueError(f"timeout must be 0 or more seconds, got {timeout!r}")
    return value


class Backoff:
    """The pauses between reads until a deadline."""

    def __init__(self, timeout: timedelta | float | None, what: str) -> None:
        limit = seconds(timeout)
        self.deadline = None if limit is None else time.monotonic() + limit
        self.pause = FIRST_PAUSE
        self.what = what
        self.first = True  # no read has missed yet

    def missed(self) -> float:
        """The pause after a read that found no end; ResultTimeout once the deadline has
        passed."""
        self.first = False
        pause = self.pause
        self.pause = min(self.pause * 2, LONGEST_PAUSE)
        if self.deadline is None:
            return pause
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ResultTimeout(f"{self.what} had not ended after the timeout")
        return min(pause, left)

    def woken(self) -> float:
        """The pause after a read that found no end, when a notification wakes the
        waiter: FALLBACK_PAUSE or what is left before the deadline."""
        self.missed()  # raises at the deadline
        if self.deadline is None:
            return FALLBACK_PAUSE
        return min(FALLBACK_PAUSE, max(self.deadline - time.monotonic(), 0.0))


class Ends:
    """The notifications one wait listens for: its key in the alias's watch."""

    def __init__(self, watch: EndWatch, key: str) -> None:
        self.watch, self.key = watch, key

    def pause(self, backoff: Backoff) -> float:
        """Notified waits pause long; while LISTEN is down they read as elsewhere."""
        return backoff.woken() if self.watch.listening.is_set() else backoff.missed()

    @contextmanager
    def subscribed(self, wake: Callable[[], None]) -> Iterator[None]:
        self.watch.subscribe(self.key, wake)
        try:
            yield
        finally:
            self.watch.unsubscribe(self.key, wake)


def ends_of(alias: str, key: str) -> Ends | None:
    """The notifications a wait on ``alias`` may listen for; None where it reads (and
    inside a transaction, where it never waits)."""
    if watcher is None or connections[alias].in_atomic_block:
        return None
    watch = watcher(alias)
    return None if watch is None else Ends(watch, key)


def may_flag(ends: Ends | None, alias: str) -> bool:
    """Whether a first read flags its row: not inside a transaction (see the module)."""
    return ends is not None and not connections[alias].in_atomic_block


def refuse_in_transaction(alias: str, what: str) -> None:
    if connections[alias].in_atomic_block:
        raise GatorError(
            f"cannot wait for {what} inside transaction.atomic() on {alias!r}: a job "
            "dispatched in it is not committed, so no worker can run it, and the "
            "transaction's snapshot may never show its end; wait after the commit"
        )


def _wait(done: Callable[[bool], T | None], backoff: Backoff, ends: Ends | None) -> T:
    if ends is None:
        while (outcome := done(backoff.first)) is None:
            time.sleep(backoff.missed())
        return outcome
    woken = threading.Event()
    with ends.subscribed(woken.set):
        while True:
            woken.clear()  # before the read: a notification after it is not missed
            if (outcome := done(backoff.first)) is not None:
                return outcome
            woken.wait(ends.pause(backoff))


async def _await(done: Callable[[bool], T | None], backoff: Backoff, ends: Ends | None) -> T:
    # thread_sensitive: the read runs where the caller's sync code (and its transaction)
    # runs, as aenqueue's insert does.
    read = sync_to_async(done, thread_sensitive=True)
    if ends is None:
        while (outcome := await read(backoff.first)) is None:
            await asyncio.sleep(backoff.missed())
        return outcome
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()

    def wake() -> None:  # on the listener's thread
        with suppress(RuntimeError):  # the loop has closed: nobody waits any more
            loop.call_soon_threadsafe(woken.set)

    with ends.subscribed(wake):
        while True:
            woken.clear()
            if (outcome := await read(backoff.first)) is not None:
                return outcome
            pause = ends.pause(backoff)  # ResultTimeout, a TimeoutError: not suppressed
            with suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), pause)


class _Ended:
    """An outcome that is there (its value may be None, which ``_wait`` reads as "not yet")."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


# Jobs --------------------------------------------------------------------------------------


def _job_alias(job: Job) -> str:
    if job.pk is None:
        raise ValueError(
            f"job {job.name} has no id: it is not in the database yet (dispatched with "
            "on_commit, before the commit?)"
        )
    return job._state.db or conf.database()


def _job_check(job: Job, alias: str, ends: Ends | None) -> Callable[[bool], _Ended | None]:
    what = f"job {job.name} #{job.pk}"
    rows = type(job).objects.using(alias).filter(pk=job.pk)

    def gone() -> Exception:
        return type(job).DoesNotExist(f"{what} is not in the database (deleted or pruned)")

    def done(first: bool) -> _Ended | None:
        if first and ends is not None and may_flag(ends, alias):
            state = ends.watch.flag_job(job.pk)
        else:
            state = rows.values_list("state", flat=True).first()
        if state is None:
            raise gone()
        if state not in FINAL_STATES:
            if first:
                refuse_in_transaction(alias, what)
            return None
        row = rows.values_list("state", "result", "error_class", "last_error").first()
        if row is None:
            raise gone()
        job.state, job.result, job.error_class, job.last_error = row
        return _Ended(None)

    return done


def job_outcome(job: Job) -> Any:
    """The result of ``job`` (read by :func:`wait_job`; decrypted, for an encrypted job's:
    the waiter is the application's code, which holds the keys), or its final error."""
    if job.state == JobState.SUCCEEDED:
        return open_value(job.result, f"the result of job {job.pk} ({job.name})")
    raise JobFailed(job.pk, job.name, job.state, job.error_class or "", job.last_error)


def wait_job(job: Job, timeout: timedelta | float | None) -> Any:
    """See ``Job.wait_result``."""
    alias = _job_alias(job)
    ends = ends_of(alias, f"j{job.pk}")
    _wait(_job_check(job, alias, ends), Backoff(timeout, f"job {job.name} #{job.pk}"), ends)
    return job_outcome(job)


async def await_job(job: Job, timeout: timedelta | float | None) -> Any:
    """See ``Job.await_result``."""
    alias = _job_alias(job)
    ends = ends_of(alias, f"j{job.pk}")
    what = f"job {job.name} #{job.pk}"
    await _await(_job_check(job, alias, ends), Backoff(timeout, what), ends)
    return job_outcome(job)


# Workflows ---------------------------------------------------------------------------------

#: Step states of a workflow that has not ended.
OPEN = (StepState.BLOCKED, StepState.RELEASED)


class RunRows:
    """What a workflow's wait reads, as the workflows module gives it (this module imports
    neither models module: they import it): the run's steps, the steps whose end fails
    the run (dead ones that cancel what follows, in order), and the jobs table."""

    def __init__(self, run: WorkflowRun, steps: Any, fatal: Any, jobs: Any) -> None:
        self.run, self.steps, self.fatal, self.jobs = run, steps, fatal, jobs
        self.alias = run._alias()
        self.what = f"workflow {run.pk} ({run.name or 'unnamed'})"
        self.ends = ends_of(self.alias, f"r{run.pk}")

    def check(self, first: bool) -> _Ended | None:
        if first and not type(self.run).objects.using(self.alias).filter(pk=self.run.pk).exists():
            raise type(self.run).DoesNotExist(
                f"{self.what} is not in the database (deleted or pruned)"
            )
        if first and self.ends is not None and may_flag(self.ends, self.alias):
            self.ends.watch.flag_run(self.run.pk)
        if self.steps.filter(state__in=OPEN).exists():
            if first:
                refuse_in_transaction(self.alias, self.what)
            return None
        return _Ended(self.outcome())

    def outcome(self) -> dict[str, Any]:
        """``{leaf step name: result}`` of the ended workflow, or WorkflowFailed for its
        first fatal dead step or, without one, its first cancelled step."""
        failed = self.fatal.order_by("position").first() or (
            self.steps.filter(state=StepState.CANCELLED).order_by("position").first()
        )
        if failed is not None:
            raise _failure(self.run, failed, self.jobs)
        fields = ("position", "label", "state", "job_id", "batch_id", "members", "children")
        out: dict[str, Any] = {}
        for row in self.steps.order_by("position").values(*fields):
            if row["children"]:
                continue  # not a leaf
            name = row["label"] or str(row["position"])
            if row["members"] is not None:
                members = self.jobs.filter(batch_id=row["batch_id"]).order_by("pk")
                batch = row["batch_id"] is not None
                results = members.values_list("result", flat=True) if batch else []
                out[name] = [open_value(r, f"a result of step {name!r}") for r in results]
            elif row["job_id"] is not None and row["state"] == StepState.SUCCEEDED:
                result = self.jobs.filter(pk=row["job_id"]).values_list("result", flat=True)
                out[name] = open_value(result.first(), f"the result of step {name!r}")
            else:
                out[name] = None  # ended dead under on_dead="continue"
        return out


def _failure(run: WorkflowRun, step: Any, jobs: Any) -> WorkflowFailed:
    name = step.label or str(step.position)
    row = None if step.job_id is None else jobs.filter(pk=step.job_id).first()
    error = None
    if row is not None and row.state in (JobState.DEAD, JobState.CANCELLED):
        error = JobFailed(row.pk, row.name, row.state, row.error_class or "", row.last_error)
    if step.reason:
        reason = step.reason
    elif error is not None:
        reason = str(error)
    elif step.batch_id is not None:
        reason = f"batch {step.batch_id} has members that ended dead"
    else:
        reason = f"its job ended {step.state}"
    return WorkflowFailed(str(run.pk), name, step.state, reason, error)


def wait_run(rows: RunRows, timeout: timedelta | float | None) -> dict[str, Any]:
    """See ``WorkflowRun.wait_result``."""
    ended: _Ended = _wait(rows.check, Backoff(timeout, rows.what), rows.ends)
    return dict(ended.value)


async def await_run(rows: RunRows, timeout: timedelta | float | None) -> dict[str, Any]:
    """See ``WorkflowRun.await_result``."""
    ended: _Ended = await _await(rows.check, Backoff(timeout, rows.what), rows.ends)
    return dict(ended.value)
