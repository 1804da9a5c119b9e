"""Running one claimed job and deciding what its outcome is. No database writes here:
the caller writes the outcome with a compare-and-set on its claim."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from django.db import transaction

from django_gator import conf, encryption, signals, tracing
from django_gator.attempts import Failure, HandedBack, Outcome, Snoozed, Success
from django_gator.databases import for_queue
from django_gator.exceptions import (
    GatorError,
    HandBack,
    JobCancelled,
    JobNotRegistered,
    Snooze,
    TransactionLeftOpen,
    Undecryptable,
    snooze_seconds,
)
from django_gator.logutil import safe
from django_gator.longjobs import Journal
from django_gator.payload import result_json
from django_gator.queueable import Queueable, effective_timeout, get_job_class
from django_gator.rows import ClaimedJob
from django_gator.states import JobState
from django_gator.worker.errors import (
    age_seconds,
    error_entry,
    exception_text,
    loggable_traceback,
    qualified_name,
)
from django_gator.worker.handler import call_handle
from django_gator.worker.hygiene import ConnectionWatch
from django_gator.worker.policy import decide_retry, outage_failure

logger = logging.getLogger("django_gator.worker")


class BadRow(GatorError):
    """A row that cannot be turned into a call: its args are not a list, its kwargs not an
    object. Retrying cannot fix it, so the job goes straight to ``dead``."""


class ClaimLost(GatorError):
    """Raised inside an atomic job's transaction when its success mark found the job no
    longer ours: the transaction, and so the job's effects, roll back."""


#: Writes a success mark: called with the result JSON, returns whether the mark landed.
Commit = Callable[[str | None], bool]


def run_claimed(
    job: ClaimedJob,
    worker_id: str,
    commit: Commit | None = None,
    *,
    watch: bool | Sequence[Any] = False,
    atomic: Callable[[], AbstractContextManager[Any]] | None = None,
    journal: Journal | None = None,
) -> Outcome:
    """:func:`_run_claimed`, in a span that continues the dispatch's trace when
    OpenTelemetry is installed (see :mod:`django_gator.tracing`)."""
    options: dict[str, Any] = {"watch": watch, "atomic": atomic, "journal": journal}
    return tracing.traced_run(job, lambda: _run_claimed(job, worker_id, commit, **options))


def _run_claimed(
    job: ClaimedJob,
    worker_id: str,
    commit: Commit | None = None,
    *,
    watch: bool | Sequence[Any] = False,
    atomic: Callable[[], AbstractContextManager[Any]] | None = None,
    journal: Journal | None = None,
) -> Outcome:
    """Run ``job``'s handler; never raises (a BaseException from user code is an outcome).

    A :class:`~django_gator.exceptions.Snooze` raised by the handler (or its middleware)
    is a :class:`Snoozed` outcome: no error entry, no ``on_error()``, no retry decision. For
    an atomic job it was raised inside the transaction, so the job's writes roll back.

    For a job class with ``atomic = True``, ``commit`` writes the success mark inside the
    transaction that wraps the middleware and ``handle()``, so the job's effects and its
    success commit together or not at all. ``atomic`` opens that transaction (the worker
    passes its engine's, which on SQLite takes turns with other atomic jobs); by default
    ``transaction.atomic()`` on the job's database (its queue's: see :mod:`.databases`).

    With ``watch`` (worker threads, whose connections serve job after job), every
    connection the job used is checked afterwards and restored (see :mod:`.hygiene`): a
    transaction the job left open is rolled back and the attempt fails with
    :class:`TransactionLeftOpen`, as its uncommitted writes are gone. ``watch`` may be the
    thread's connections (``connections.all()``), if the caller has them already.
    ``journal``: the attempt's progress and checkpoint (see _handle_plainly).
    """
    instance: Queueable | None = None
    started = time.perf_counter()
    watcher = ConnectionWatch(None if watch is True else watch) if watch else None
    raised: BaseException | None = None
    outcome: Outcome
    try:
        with watcher or nullcontext():
            instance = instance_for(job, journal)
            job_class = type(instance)
            signals.send(signals.job_started, job_class, job=instance)
            if job_class.atomic and commit is not None:
                outcome = _handle_atomically(job, instance, worker_id, commit, atomic)
            else:
                outcome = _handle_plainly(job, instance)
    except JobNotRegistered as exc:
        return unknown_name_failure(job, worker_id, exc)
    except (BadRow, Undecryptable) as exc:
        return dead_failure(job, worker_id, exc)
    except BaseException as exc:
        raised = exc
    leftovers = watcher.clean() if watcher is not None else []
    if leftovers:
        error = left_open(job, leftovers)
        # An atomic job's outcome is settled: its success mark committed (or found the
        # claim lost) inside handle()'s transaction, before the stray one was opened.
        if raised is None and isinstance(outcome, Success) and outcome.written is None:
            raised = error
    if raised is not None:
        outcome = raised_outcome(job, worker_id, raised, instance)
    finished(instance, outcome, time.perf_counter() - started)
    return outcome


def _handle_plainly(job: ClaimedJob, instance: Queueable) -> Success:
    """Run a job's handler. Its journal (progress and checkpoint, see
    :mod:`django_gator.longjobs`) is written once more as it ends, whatever the outcome,
    before the outcome is; an atomic job's inside its transaction, before its success
    mark (see _handle_atomically: a failed atomic job's roll back with it)."""
    try:
        return Success(stored_result(job, instance, call_handle(instance)))
    finally:
        if instance._gator_journal is not None:
            instance._gator_journal.flush()


def _handle_atomically(
    job: ClaimedJob,
    instance: Queueable,
    worker_id: str,
    commit: Commit,
    atomic: Callable[[], AbstractContextManager[Any]] | None,
) -> Success:
    """Run an atomic job's handler and write its success mark in one transaction; a
    success not ``written`` if the mark found the claim lost (the transaction rolled back)."""
    result: str | None = None
    try:
        with atomic() if atomic else transaction.atomic(using=for_queue(job.queue)):
            result = stored_result(job, instance, call_handle(instance))
            if instance._gator_journal is not None:
                instance._gator_journal.flush()  # in the transaction: it commits with the job
            if not commit(result):
                raise ClaimLost(f"job {job.id} is no longer claimed by {worker_id}")
    except ClaimLost:
        return Success(result, written=False)
    except BaseException:
        if instance._gator_journal is not None:  # rolled back with the rest: written again
            instance._gator_journal.write_logs()
        raise
    return Success(result, written=True)


def left_open(job: ClaimedJob, leftovers: Sequence[str]) -> TransactionLeftOpen:
    """Log what ``job`` left open on its connections (rolled back and reconnected by the
    watch): the error its attempt fails with, unless its outcome was settled already."""
    logger.warning(
        "Job left %s; rolled back and reconnected id=%s name=%s attempt=%s",
        " and ".join(leftovers),
        job.id,
        safe(job.name),
        job.attempts,
    )
    return TransactionLeftOpen(
        f"handle() returned with {' and '.join(leftovers)}; its uncommitted writes "
        "were rolled back. Commit with transaction.atomic() instead of a raw BEGIN, "
        "and end every transaction the job starts."
    )


def raised_outcome(
    job: ClaimedJob, worker_id: str, raised: BaseException, instance: Queueable | None
) -> Snoozed | HandedBack | Failure:
    """The outcome of an attempt whose handler raised ``raised``: a snooze, a hand-back
    (``each()`` in a stopping worker), or a failure (retried or dead per the job's policy,
    after its on_error())."""
    if isinstance(raised, HandBack):
        return HandedBack(raised)
    if isinstance(raised, Snooze):
        try:
            # Checked again: a subclass may have set its own ``seconds``. Milliseconds:
            # SQLite reads the delay back from its decimal text.
            return Snoozed(round(snooze_seconds(raised.seconds), 3), raised)
        except (TypeError, ValueError) as bad:  # a failure that names the value
            return _failure(job, worker_id, bad, instance)
    return _failure(job, worker_id, raised, instance)


def stored_result(job: ClaimedJob, instance: Queueable, value: Any) -> str | None:
    """What handle() returned as the row stores it: JSON, sealed for an encrypted class."""
    result = result_json(job, value)
    if result is not None and type(instance).traits.encrypted:
        return encryption.seal_json(result)
    return result


def instance_for(job: ClaimedJob, journal: Journal | None = None) -> Queueable:
    """The job class's instance for this attempt, writing its progress and checkpoint
    through ``journal``; JobNotRegistered, BadRow, or Undecryptable (sealed arguments that
    do not open: the handler never sees them)."""
    job_class = get_job_class(job.name)
    args, kwargs = job.args, job.kwargs
    if job_class.traits.encrypted or type(args) is dict:
        args, kwargs = encryption.open_payload(job.id, job.name, args, kwargs)
    if not isinstance(args, list):
        raise BadRow(f"job {job.id}: args must be a JSON array, got {safe(args, 80)}")
    if not isinstance(kwargs, dict):
        raise BadRow(f"job {job.id}: kwargs must be a JSON object, got {safe(kwargs, 80)}")
    instance = job_class(
        job_id=job.id, attempt=job.attempts, queue=job.queue, args=args, kwargs=kwargs
    )
    instance._gator_journal = journal
    return instance


def finished(instance: Queueable | None, outcome: Outcome, duration: float) -> None:
    """Send job_finished for an attempt whose outcome is decided. A snooze sends it with
    ``state="waiting"`` and the Snooze as ``exception``."""
    if instance is None:
        return
    job_class = type(instance)
    if not signals.job_finished.has_listeners(job_class):
        return
    exc: BaseException | None
    if isinstance(outcome, Success):
        state, exc = JobState.SUCCEEDED.value, None
    elif isinstance(outcome, (Snoozed, HandedBack)):
        state = (JobState.CANCELLED if instance._cancel_seen else JobState.WAITING).value
        exc = outcome.exception
    else:
        state, exc = outcome_state(outcome, instance), outcome.exception
    signals.send(
        signals.job_finished, job_class, job=instance, state=state, exception=exc, duration=duration
    )


def outcome_state(outcome: Failure, instance: Queueable | None) -> str:
    """The state a failure will write (cancellation asked for wins over a retry)."""
    if instance is not None and instance._cancel_seen:
        return JobState.CANCELLED.value
    return outcome.state


def dead_failure(job: ClaimedJob, worker_id: str, exc: BaseException) -> Failure:
    """The outcome of an attempt that retrying cannot fix (a bad row; a job class no
    longer registered when its timeout or hand-back is written): ``dead``."""
    return _failure(job, worker_id, exc, None, force_dead=True)


def _failure(
    job: ClaimedJob,
    worker_id: str,
    exc: BaseException,
    instance: Queueable | None,
    *,
    force_dead: bool = False,
) -> Failure:
    cancelled = isinstance(exc, JobCancelled)
    if not force_dead and not cancelled:
        outage = outage_failure(job, worker_id, exc)
        if outage is not None:
            return outage
    error, summary = error_entry(exc, attempt=job.attempts, worker_id=worker_id)
    if instance is not None and type(instance).traits.encrypted:
        error, summary = encryption.seal_error(error, summary)
    dead, delay, queue = True, None, job.queue
    if not force_dead and not cancelled and instance is not None:
        dead, delay, queue = decide_retry(instance, exc, job)
    if instance is not None and not cancelled:
        try:
            instance.on_error(exc)
        except Exception as hook_exc:
            logger.error(
                "on_error() raised id=%s name=%s traceback=%s",
                job.id,
                safe(job.name),
                loggable_traceback(job, hook_exc),
            )
    if cancelled:
        return Failure.cancel(queue, error, summary, exception=exc)
    if dead:
        return Failure.discard(queue, error, summary, exception=exc)
    # Milliseconds: SQLite reads the delay back from its decimal text.
    return Failure.retry(queue, error, summary, after=round(float(delay or 0), 3), exception=exc)


#: Shortest and longest wait between two tries of a job whose name is unknown.
UNKNOWN_NAME_FIRST_WAIT = 5.0
UNKNOWN_NAME_MAX_WAIT = 60.0


def unknown_name_failure(job: ClaimedJob, worker_id: str, exc: JobNotRegistered) -> Failure:
    """The outcome of a job whose name this worker's registry does not have.

    In a rolling deploy new code dispatches a job that a worker still running the old
    code claims; the job must wait for a worker that knows it, not die. So it goes back to
    the queue, its attempt not charged, retried with a growing wait until
    ``GATOR_UNKNOWN_JOB_WINDOW`` seconds after it was created; after that (a typo, a
    module no worker imports, a tampered row) it ends ``dead``. The worker's "Processed
    job" line carries the error, and with it the likely cause."""
    window = conf.unknown_job_window()
    age = age_seconds(job.created_at)
    if age is None or age >= window:
        error, summary = error_entry(exc, attempt=job.attempts, worker_id=worker_id, tb="")
        return Failure.discard(job.queue, error, summary)
    # The wait grows with the job's age (5, 5, 10, 20, 40, 60, 60 ... s), and the last one
    # ends at the window's end.
    wait = min(max(UNKNOWN_NAME_FIRST_WAIT, age), UNKNOWN_NAME_MAX_WAIT, window - age)
    modules = ", ".join(f"`{m}`" for m in conf.autodiscover_modules())
    cause = UnknownJobName(
        f"job name {exc.name!r} is not registered in this worker: it runs older code than "
        "the dispatcher, or the job's module is not imported (workers import the "
        f"{modules} module of each installed app, and those in GATOR_AUTODISCOVER); "
        f"waiting {wait:.0f} s for a worker that knows it, dead after {window - age:.0f} s"
    )
    error, summary = error_entry(cause, attempt=job.attempts, worker_id=worker_id, tb="")
    return Failure.give_back(job.queue, error, summary, after=round(wait, 3))


class UnknownJobName(GatorError):
    """In an error history: a worker that did not know the job's name handed it back."""


def unstorable_failure(
    failure: Failure, error: BaseException, *, attempt: int, worker: str
) -> Failure:
    """``failure`` with its error entry replaced by one that the database can store: the
    original's class and message in ASCII, cut short, and what the database said."""
    original = failure.last_error.encode("ascii", "backslashreplace").decode("ascii")
    exc = UnstorableError(
        f"the error of this attempt could not be stored ({qualified_name(error)}: "
        f"{exception_text(error)[0][:300]}); it began: {original[:300]}"
    )
    entry, summary = error_entry(exc, attempt=attempt, worker_id=worker, tb="")
    return failure.with_error(entry, summary)


class UnstorableError(GatorError):
    """Stands in an error history for an error the database refused to store."""


def failure_for(
    job: ClaimedJob, worker_id: str, exc: BaseException, duration: float | None = None
) -> Failure:
    """The outcome of ``job`` failing with ``exc`` outside ``handle()`` (a timeout, a
    charged hand-back), with the job class's retry policy applied. ``duration``: seconds
    the attempt ran, for job_finished (by default its timeout)."""
    try:
        job_class = get_job_class(job.name)
        args, kwargs = job.args, job.kwargs
        if job_class.traits.encrypted or type(args) is dict:
            args, kwargs = encryption.open_payload(job.id, job.name, args, kwargs)
    except (JobNotRegistered, Undecryptable):
        return dead_failure(job, worker_id, exc)
    instance = job_class(
        job_id=job.id, attempt=job.attempts, queue=job.queue, args=args, kwargs=kwargs
    )
    outcome = _failure(job, worker_id, exc, instance)
    if duration is None:
        duration = float(effective_timeout(job_class) or 0)
    finished(instance, outcome, duration)
    return outcome
