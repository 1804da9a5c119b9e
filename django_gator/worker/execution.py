"""Running one claimed job and deciding what its outcome is. No database writes here:
the caller writes the outcome with a compare-and-set on its claim."""

from __future__ import annotations

import json
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import transaction

from django_gator import conf, retry, signals
from django_gator.engines.base import ClaimedJob, Failure
from django_gator.exceptions import GatorError, JobCancelled, JobNotRegistered
from django_gator.logutil import safe
from django_gator.queueable import Queueable, get_job_class
from django_gator.redaction import mask_text, secret_values
from django_gator.validation import check_json, dumps

logger = logging.getLogger("django_gator.worker")

LAST_ERROR_CHARS = 1000
MESSAGE_CHARS = 4000


class BadRow(GatorError):
    """A row that cannot be turned into a call: its args are not a list, its kwargs not an
    object. Retrying cannot fix it, so the job goes straight to ``dead``."""


@dataclass(slots=True)
class Success:
    result: str | None  # JSON, or None for a None / non-JSON return value
    batched: bool = False  # left for the fetcher to write with other successes
    # Atomic jobs: True if the success mark committed with handle()'s transaction, False if
    # the claim was lost and the transaction rolled back; None for other jobs.
    written: bool | None = None


class ClaimLost(GatorError):
    """Raised inside an atomic job's transaction when its success mark found the job no
    longer ours: the transaction, and so the job's effects, roll back."""


#: Writes a success mark: called with the result JSON, returns whether the mark landed.
Commit = Callable[[str | None], bool]


def qualified_name(exc: BaseException) -> str:
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def error_entry(
    exc: BaseException, *, attempt: int, worker_id: str, tb: str | None = None
) -> tuple[str, str]:
    """(JSON of one error-history entry, the one-line summary for ``last_error``)."""
    message = str(exc)
    if tb is None:
        tb = "".join(traceback.format_exception(exc))
    limit = conf.max_traceback_chars()
    if len(tb) > limit:
        tb = tb[: limit // 2] + "\n...\n" + tb[-limit // 2 :]
    entry = {
        "attempt": attempt,
        "at": datetime.now(UTC).isoformat(),
        "worker": worker_id,
        "class": qualified_name(exc),
        "message": message[:MESSAGE_CHARS],
        "traceback": tb,
    }
    summary = f"{qualified_name(exc)}: {message}" if message else qualified_name(exc)
    return dumps(entry), summary[:LAST_ERROR_CHARS]


def call_handle(instance: Queueable) -> Any:
    """``handle()`` wrapped in the middleware of ``GATOR_MIDDLEWARE`` (outermost first),
    then the class's own."""
    layers = [*conf.middleware(), *type(instance).middleware]
    if not layers:
        return instance.handle(*instance.args, **instance.kwargs)

    def call(index: int) -> Any:
        if index == len(layers):
            return instance.handle(*instance.args, **instance.kwargs)
        return layers[index](instance, lambda: call(index + 1))

    return call(0)


def run_claimed(job: ClaimedJob, worker_id: str, commit: Commit | None = None) -> Success | Failure:
    """Run ``job``'s handler; never raises (a BaseException from user code is an outcome).

    For a job class with ``atomic = True``, ``commit`` writes the success mark inside the
    transaction that wraps the middleware and ``handle()``, so the job's effects and its
    success commit together or not at all.
    """
    instance: Queueable | None = None
    started = time.perf_counter()
    result_json: str | None = None
    try:
        job_class = get_job_class(job.name)
        if not isinstance(job.args, list):
            raise BadRow(f"job {job.id}: args must be a JSON array, got {safe(job.args, 80)}")
        if not isinstance(job.kwargs, dict):
            raise BadRow(f"job {job.id}: kwargs must be a JSON object, got {safe(job.kwargs, 80)}")
        instance = job_class(
            job_id=job.id, attempt=job.attempts, queue=job.queue, args=job.args, kwargs=job.kwargs
        )
        signals.send(signals.job_started, job_class, job=instance)
        if job_class.atomic and commit is not None:
            with transaction.atomic(using=conf.database()):
                result_json = _result_json(job, call_handle(instance))
                if not commit(result_json):
                    raise ClaimLost(f"job {job.id} is no longer claimed by {worker_id}")
            outcome: Success | Failure = Success(result_json, written=True)
        else:
            outcome = Success(_result_json(job, call_handle(instance)))
    except ClaimLost:
        outcome = Success(result_json, written=False)
    except (JobNotRegistered, BadRow) as exc:
        return _failure(job, worker_id, exc, None, force_dead=True)
    except BaseException as exc:
        outcome = _failure(job, worker_id, exc, instance)
    finished(instance, outcome, time.perf_counter() - started)
    return outcome


def finished(instance: Queueable | None, outcome: Success | Failure, duration: float) -> None:
    """Send job_finished for an attempt whose outcome is decided."""
    if instance is None:
        return
    job_class = type(instance)
    if not signals.job_finished.has_listeners(job_class):
        return
    if isinstance(outcome, Success):
        state, exc = "succeeded", None
    else:
        state, exc = outcome_state(outcome, instance), outcome.exception
    signals.send(
        signals.job_finished, job_class, job=instance, state=state, exception=exc, duration=duration
    )


def outcome_state(outcome: Failure, instance: Queueable | None) -> str:
    """The state a failure will write (cancellation asked for wins over a retry)."""
    if outcome.cancelled or (instance is not None and instance._cancel_seen):
        return "cancelled"
    return "dead" if outcome.dead else "failed"


def _result_json(job: ClaimedJob, result: Any) -> str | None:
    if result is None:
        return None
    try:
        check_json(result, "result")
    except TypeError as exc:
        logger.warning(
            "Job result not stored id=%s name=%s reason=%s", job.id, safe(job.name), safe(exc)
        )
        return None
    return json.dumps(result, separators=(",", ":"), ensure_ascii=False)


def _failure(
    job: ClaimedJob,
    worker_id: str,
    exc: BaseException,
    instance: Queueable | None,
    *,
    force_dead: bool = False,
) -> Failure:
    error, summary = error_entry(exc, attempt=job.attempts, worker_id=worker_id)
    dead, delay, queue = True, None, job.queue
    cancelled = isinstance(exc, JobCancelled)
    if not force_dead and not cancelled and instance is not None:
        dead, delay, queue = decide_retry(instance, exc, job)
    # Milliseconds: SQLite reads the delay back from its decimal text.
    retry_in = None if dead or cancelled else round(float(delay or 0), 3)
    if instance is not None and not cancelled:
        try:
            instance.on_error(exc)
        except Exception as hook_exc:
            logger.error(
                "on_error() raised id=%s name=%s traceback=%s",
                job.id,
                safe(job.name),
                _loggable_traceback(job, hook_exc),
            )
    return Failure(
        dead=dead and not cancelled,
        retry_in=retry_in,
        queue=queue,
        error=error,
        last_error=summary,
        cancelled=cancelled,
        exception=exc,
    )


def _loggable_traceback(job: ClaimedJob, exc: BaseException) -> str:
    """The traceback of an exception raised by a job's hook, as one log-safe line: the
    job's secrets masked, control characters escaped (user code may have put the payload
    into its message)."""
    text = "".join(traceback.format_exception(exc))
    secrets = secret_values(job.name, job.args, job.kwargs)
    return safe(mask_text(text, secrets), conf.max_traceback_chars())


def decide_retry(
    instance: Queueable, exc: BaseException, job: ClaimedJob
) -> tuple[bool, float | None, str]:
    """(dead?, seconds to wait, queue of the retry) after ``exc`` on ``job``."""
    policy = type(instance).retry
    retry_count = max(job.attempts - 1, 0)
    try:
        decision = instance.retry_decision(exc, retry_count)
    except Exception as hook_exc:
        logger.error(
            "retry_decision() raised; applying the class policy id=%s name=%s traceback=%s",
            job.id,
            safe(job.name),
            _loggable_traceback(job, hook_exc),
        )
        decision = None
    queue = policy.queue if policy is not None and policy.queue else job.queue
    if decision is False:
        return True, None, queue
    if policy is not None and not policy.allows(retry_count):
        return True, None, queue
    if decision is None or decision is True:
        if policy is None:
            return True, None, queue
        return False, policy.delay(retry_count), queue
    try:
        return False, retry.delay_for(decision, retry_count), queue
    except ValueError:
        logger.error(
            "retry_decision() returned %s, not seconds, 'exponential' or False; the job goes "
            "dead id=%s name=%s",
            safe(decision),
            job.id,
            safe(job.name),
        )
        return True, None, queue


def failure_for(job: ClaimedJob, worker_id: str, exc: BaseException) -> Failure:
    """The outcome of ``job`` failing with ``exc`` outside ``handle()`` (a timeout), with the
    job class's retry policy applied."""
    try:
        job_class = get_job_class(job.name)
    except JobNotRegistered:
        return _failure(job, worker_id, exc, None, force_dead=True)
    instance = job_class(
        job_id=job.id, attempt=job.attempts, queue=job.queue, args=job.args, kwargs=job.kwargs
    )
    outcome = _failure(job, worker_id, exc, instance)
    finished(instance, outcome, float(job_class.timeout or 0))
    return outcome
