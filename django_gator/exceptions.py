"""The exceptions django-gator raises, all under :class:`GatorError`."""

from __future__ import annotations

import math
from datetime import timedelta

from django.db import OperationalError


class GatorError(Exception):
    """Base class of every error raised by django-gator itself."""


class JobNotRegistered(GatorError, LookupError):
    """A job name that is not in the registry (a row from an older deploy, or a typo)."""

    def __init__(self, name: str, suggestions: list[str] | None = None) -> None:
        self.name = name
        self.suggestions = suggestions or []
        message = f"job name {name!r} is not registered"
        if self.suggestions:
            message += "; did you mean " + " or ".join(repr(s) for s in self.suggestions) + "?"
        super().__init__(message)


class AlreadyRegistered(GatorError):
    """Two different classes tried to register under one job name."""


class PayloadTooLarge(GatorError, ValueError):
    """The JSON payload of a job is larger than ``GATOR_MAX_PAYLOAD_BYTES``."""


class ResultTooLarge(GatorError, ValueError):
    """What a job returned is more JSON than ``GATOR_MAX_RESULT_BYTES``: its attempt fails
    (nothing is cut short silently)."""


class ResultNotJSON(GatorError, TypeError):
    """What a job returned does not round-trip through JSON (a datetime, a model instance,
    a set...): its attempt fails, as with :class:`ResultTooLarge`, rather than storing
    NULL as if it had returned None."""


class WorkflowError(GatorError, ValueError):
    """A signal that no wait step of the workflow can take: an unknown workflow, no wait
    for a signal of that name, or a wait that has ended."""


class WaitTimedOut(GatorError):
    """A wait step's signal did not come before its timeout (and it has no
    ``on_timeout``): the wait ends dead, cancelling the steps after it."""


class WaitRejected(GatorError):
    """A wait step was rejected (``WorkflowRun.reject``, the admin's Reject): it ends dead
    and cancels the steps after it."""


class ResultTimeout(GatorError, TimeoutError):
    """``wait_result(timeout=...)`` gave up: the job (or workflow) it names had not ended
    by then. It may still end later; nothing about it changed."""


class JobFailed(GatorError):
    """What ``job.wait_result()`` raises for a job that ended without a result: ``dead``
    (its last error in ``error_class`` and ``error``) or ``cancelled``."""

    def __init__(self, job_id: int, name: str, state: str, error_class: str, error: str) -> None:
        self.job_id = job_id
        self.name = name
        self.state = state
        self.error_class = error_class
        self.error = error
        summary = error.strip().splitlines()[-1] if error.strip() else error_class
        message = f"job {name} #{job_id} ended {state}"
        super().__init__(f"{message}: {summary}" if summary else message)


class WorkflowFailed(GatorError):
    """What ``run.wait_result()`` raises for a workflow that ended with a step dead or
    cancelled: ``step`` names it; ``error`` is its job's final error (a :class:`JobFailed`,
    or None for a step cancelled before it had a job), ``reason`` says why."""

    def __init__(
        self, workflow: str, step: str, state: str, reason: str, error: JobFailed | None
    ) -> None:
        self.workflow = workflow
        self.step = step
        self.state = state
        self.reason = reason
        self.error = error
        super().__init__(f"workflow {workflow}: step {step!r} ended {state}: {reason}")


class JobTimeout(GatorError):
    """A job ran longer than its ``timeout``."""


class JobStalled(JobTimeout):
    """A job with a ``stall_timeout`` called none of ``progress()``, ``checkpoint()`` and
    ``heartbeat()`` for that long: its attempt fails with this error (retried per its
    policy), and its thread is replaced as for a timeout."""


class IsolatedProcessDied(GatorError):
    """The child process of an isolated attempt (``isolation = "process"``) ended before it
    reported the attempt's outcome: a signal (a segfault, the OOM killer, a kill) or an exit
    (``os._exit()``). The message says which, by number and name or code."""


class MemoryLimitExceeded(GatorError):
    """An isolated attempt asked for more memory than its class's ``memory_limit``."""


class HandBack(GatorError):
    """Raised by ``self.each()`` when the worker is stopping: the job goes back to
    ``waiting`` at once, its position checkpointed, its attempt not charged. Let it
    propagate out of ``handle()`` (do not catch it)."""


class WorkerLost(GatorError):
    """The worker running a job stopped heartbeating (killed, frozen or cut off)."""


class JobHandedBack(GatorError):
    """In an error history: stopping workers gave the job back while it ran
    ``GATOR_MAX_HANDBACKS`` times, so this attempt is charged (the job likely never ends;
    give its class a ``timeout``, or set ``GATOR_DEFAULT_TIMEOUT``)."""


class JobExpired(GatorError):
    """A job reached its ``expires_at`` before it started: it ends ``cancelled`` with this
    class as its ``error_class`` and is never run (see :mod:`django_gator.expiry`)."""


class JobCancelled(GatorError):
    """Raised by a job (usually after ``self.cancel_requested()`` said so) to stop early:
    the job ends ``cancelled``, with no retry."""


#: The longest a job can snooze at once (a year): a longer wait is a mistake, and would
#: overflow some databases' timestamps.
MAX_SNOOZE_SECONDS = 366 * 24 * 3600


def snooze_seconds(delay: object) -> float:
    """``delay`` (seconds, an int or float, or a timedelta) as seconds to snooze, or a
    ValueError / TypeError naming the value."""
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, int | float) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        raise TypeError(
            f"Snooze() takes seconds (an int or float) or a timedelta, got {delay!r} "
            f"({type(delay).__name__})"
        )
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise ValueError(f"Snooze() takes a finite delay of 0 seconds or more, got {delay!r}")
    if seconds > MAX_SNOOZE_SECONDS:
        raise ValueError(
            f"Snooze() takes at most {MAX_SNOOZE_SECONDS} seconds (366 days), got {delay!r}"
        )
    return seconds


class Snooze(GatorError):
    """Raised from ``handle()``: "not now, try again in ``delay``". The job goes back to
    ``waiting``, due ``delay`` later (seconds, or a timedelta), without spending an attempt
    or recording an error; its ``snoozes`` count goes up by one. A bad delay (negative,
    NaN, infinite, not a number) raises a ValueError or TypeError here instead, which
    fails the attempt like any other error."""

    def __init__(self, delay: float | timedelta) -> None:
        self.seconds = snooze_seconds(delay)
        super().__init__(f"snoozed for {self.seconds:g} s")


class TransactionLeftOpen(GatorError):
    """A job returned with a database transaction still open (a raw ``BEGIN``, an
    ``atomic()`` never left, ``set_autocommit(False)``). The worker rolled it back, so the
    job's uncommitted writes are gone, and the attempt fails."""


class SchemaMissing(GatorError):
    """django-gator's tables are not in the database: ``manage.py migrate`` has not run."""


class CrossDatabase(GatorError, ValueError):
    """A batch or workflow whose jobs' queues are routed to different job databases
    (``GATOR_QUEUE_DATABASES``): each lives within one database, so it is refused at
    dispatch, before anything is inserted."""


class ReadOnlyDatabase(GatorError):
    """The job database refuses writes (a standby, a replica, a read-only session): a
    worker pointed at it refuses to start rather than fail every claim."""


class DispatchDeadlock(GatorError, OperationalError):
    """A dispatch inside the caller's ``transaction.atomic()`` lost a deadlock: the database
    rolled back the caller's whole transaction, so only the caller can run it again."""


class EncryptionUnavailable(GatorError):
    """A job class with ``encrypted = True`` cannot have its data sealed: the
    ``cryptography`` package is missing, or ``GATOR_ENCRYPTION_KEYS`` is empty or holds a
    bad key. Its dispatch is refused (nothing is inserted)."""


class Undecryptable(GatorError):
    """An encrypted job's data does not open: its key id is not in
    ``GATOR_ENCRYPTION_KEYS``, or its ciphertext was changed. The attempt fails with it;
    the handler never runs."""

    def __init__(self, message: str, *, key_id: str) -> None:
        super().__init__(message)
        self.key_id = key_id
