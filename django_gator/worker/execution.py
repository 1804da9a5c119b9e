"""Running one claimed job and deciding what its outcome is. No database writes here:
the caller writes the outcome with a compare-and-set on its claim."""

from __future__ import annotations

import json
import logging
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django_gator import conf, retry
from django_gator.engines.base import ClaimedJob, Failure
from django_gator.exceptions import GatorError, JobNotRegistered
from django_gator.logutil import safe
from django_gator.queueable import Queueable, get_job_class
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


def run_claimed(job: ClaimedJob, worker_id: str) -> Success | Failure:
    """Run ``job``'s handler; never raises (a BaseException from user code is an outcome)."""
    instance: Queueable | None = None
    try:
        job_class = get_job_class(job.name)
        if not isinstance(job.args, list):
            raise BadRow(f"job {job.id}: args must be a JSON array, got {safe(job.args, 80)}")
        if not isinstance(job.kwargs, dict):
            raise BadRow(f"job {job.id}: kwargs must be a JSON object, got {safe(job.kwargs, 80)}")
        instance = job_class(job_id=job.id, attempt=job.attempts, queue=job.queue)
        result = instance.handle(*job.args, **job.kwargs)
    except (JobNotRegistered, BadRow) as exc:
        return _failure(job, worker_id, exc, None, force_dead=True)
    except BaseException as exc:
        return _failure(job, worker_id, exc, instance)
    return Success(_result_json(job, result))


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
    if not force_dead and instance is not None:
        dead, delay, queue = decide_retry(instance, exc, job)
    retry_at = None if dead else datetime.now(UTC) + timedelta(seconds=delay or 0)
    return Failure(dead=dead, retry_at=retry_at, queue=queue, error=error, last_error=summary)


def decide_retry(
    instance: Queueable, exc: BaseException, job: ClaimedJob
) -> tuple[bool, float | None, str]:
    """(dead?, seconds to wait, queue of the retry) after ``exc`` on ``job``."""
    policy = type(instance).retry
    retry_count = max(job.attempts - 1, 0)
    try:
        decision = instance.retry_decision(exc, retry_count)
    except Exception:
        logger.exception(
            "retry_decision() raised; applying the class policy id=%s name=%s",
            job.id,
            safe(job.name),
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
    instance = job_class(job_id=job.id, attempt=job.attempts, queue=job.queue)
    return _failure(job, worker_id, exc, instance)
