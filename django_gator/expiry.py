"""Expiry: a job with an ``expires_at`` (``expires_at=`` at dispatch, or the class's
``expires``) that has not started by then never runs.

Every claim statement of every engine takes only rows with ``expires_at IS NULL OR
expires_at > now`` (database time), so no worker starts an expired job, however long it
was away. The rows themselves are settled by :func:`settle_expired`, which each worker's
heartbeat thread runs (a bounded batch per beat, and once when it starts): they end
``cancelled``, with ``error_class`` :data:`EXPIRED_CLASS` and the reason in
``last_error``, through the same path as an operator's cancel, so a batch counts them as
cancelled members and a workflow step that expired cancels its dependents. An expiry is a
cancellation by the clock rather than by a person: a state of its own would be one more
final state for every screen, count, retention and batch rule to learn, for what the
reason already says.

The deadline is for any attempt: a failed job whose retry comes after it, or a snoozed one,
expires too (the work has gone stale, whichever attempt it would have been).
"""

from __future__ import annotations

import logging

from django.db import transaction

from django_gator import metrics
from django_gator.dbtime import DbNow
from django_gator.engines import get_engine
from django_gator.exceptions import JobExpired
from django_gator.models import READY_STATES, Job

logger = logging.getLogger("django_gator.worker")

#: ``error_class`` of a job that expired (what the admin shows and filters on).
EXPIRED_CLASS = f"{JobExpired.__module__}.{JobExpired.__qualname__}"
#: ``last_error`` of a job that expired.
EXPIRED_REASON = "expired: not started before its expires_at; never run"
#: Jobs settled per statement of a sweep.
SWEEP_BATCH = 500


def settle_expired(alias: str, limit: int = SWEEP_BATCH) -> int:
    """End up to ``limit`` waiting or failed jobs past their ``expires_at`` as
    ``cancelled`` (reason: expired), with their batches and workflow steps, in one
    transaction; returns how many."""
    ids = get_engine(alias).expired_ids(limit)
    if not ids:
        return 0
    expired = Job.objects.using(alias).filter(
        pk__in=ids, state__in=READY_STATES, expires_at__lte=DbNow()
    )
    with transaction.atomic(using=alias):
        # In id order, skipping rows another sweep (or an operator) holds: two workers'
        # sweeps never wait on each other, nor lock the same rows in opposite orders.
        locked = expired.select_for_update(skip_locked=True).order_by("pk")
        rows = list(locked.values_list("pk", "name", "queue"))
        if not rows:
            return 0
        settled = Job.objects.using(alias).filter(pk__in=[row[0] for row in rows])
        settled.update(error_class=EXPIRED_CLASS, last_error=EXPIRED_REASON)
        settled.cancel()
    for _, name, queue in rows:
        metrics.job_expired(name, queue)
    logger.info("Expired jobs cancelled count=%s first_id=%s", len(rows), rows[0][0])
    return len(rows)
