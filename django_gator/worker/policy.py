"""When a failed attempt runs again: the job class's retry policy and its
``retry_decision()``, SQLite's busy write lock, and outages of the database (retried
without charging the attempt)."""

from __future__ import annotations

import logging

from django_gator import conf, retry
from django_gator.attempts import Failure
from django_gator.engines.outages import is_busy, is_outage
from django_gator.logutil import safe
from django_gator.queueable import Queueable
from django_gator.rows import ClaimedJob
from django_gator.worker.errors import error_entry, loggable_traceback

logger = logging.getLogger("django_gator.worker")


#: The wait before retrying a job whose attempt an outage cut short: it doubles with each
#: outage the job met, from OUTAGE_FIRST_WAIT up to OUTAGE_MAX_WAIT seconds. The failure is
#: only written once the database answers again, so the first retry comes soon after.
OUTAGE_FIRST_WAIT = 1.0
OUTAGE_MAX_WAIT = 60.0


def outage_failure(job: ClaimedJob, worker_id: str, exc: BaseException) -> Failure | None:
    """The outcome of an attempt that failed because the database went away under the job
    (a restart, a failover, a killed connection: :func:`~django_gator.engines.outages.
    is_outage`), or None if ``exc`` is no such error or the job has met
    ``GATOR_OUTAGE_RETRIES`` of them already.

    An outage is not the job's fault, so the attempt is given back (the job's retry budget
    and ``retry_decision()`` are untouched, ``on_error()`` is not called) and the job is
    tried again once the database is back; the error stays in its history, marked as an
    outage, and the row counts it in ``outages``. Past the bound the failure is an
    ordinary one, which the job's own policy decides (a database that drops every attempt
    of one job is not a passing outage)."""
    limit = conf.outage_retries()
    if job.outages >= limit or not is_outage(exc):
        return None
    wait = min(OUTAGE_FIRST_WAIT * 2**job.outages, OUTAGE_MAX_WAIT)
    note = (
        f"the database connection was lost: retried without charging an attempt "
        f"(outage {job.outages + 1} of {limit})"
    )
    error, summary = error_entry(
        exc, attempt=job.attempts, worker_id=worker_id, extra={"outage": True}, note=note
    )
    return Failure.give_back(
        job.queue, error, summary, after=round(wait, 3), outage=True, exception=exc
    )


#: Attempts in all that a job failing on SQLite's "database is locked" gets (the wait
#: before each retry doubles from 1 s up to BUSY_MAX_WAIT); after that its policy applies.
BUSY_ATTEMPTS = 10
BUSY_MAX_WAIT = 60.0


def decide_retry(
    instance: Queueable, exc: BaseException, job: ClaimedJob
) -> tuple[bool, float | None, str]:
    """(dead?, seconds to wait, queue of the retry) after ``exc`` on ``job``.

    A failure on SQLite's "database is locked" is retried (see BUSY_ATTEMPTS) unless
    ``retry_decision()`` decides otherwise; every other one as the job's class says."""
    policy = type(instance).retry
    retry_count = max(job.attempts - 1, 0)
    try:
        decision = instance.retry_decision(exc, retry_count)
    except Exception as hook_exc:
        logger.error(
            "retry_decision() raised; applying the class policy id=%s name=%s traceback=%s",
            job.id,
            safe(job.name),
            loggable_traceback(job, hook_exc),
        )
        decision = None
    queue = policy.queue if policy is not None and policy.queue else job.queue
    if decision is None and job.attempts < BUSY_ATTEMPTS and is_busy(exc):
        # SQLite's write lock stayed busy beyond the busy timeout: another writer's doing,
        # not the job's, so it is tried again soon, whatever its retry policy.
        return False, min(2.0**retry_count, BUSY_MAX_WAIT), queue
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
