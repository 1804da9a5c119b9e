"""Automatic pruning: the workers delete succeeded and cancelled jobs past their retention,
so the jobs table stays bounded without a cron job.

Every ``GATOR_PRUNE_INTERVAL`` seconds (with jitter) each worker tries to take the prune
lease (:class:`~django_gator.models.Lease`, one row): the one that gets it deletes, the
others wait for the next interval. The holder deletes ``GATOR_PRUNE_BATCH_SIZE`` rows per
short transaction, the oldest ``finished_at`` first (the ``(state, finished_at)`` index),
pauses ``GATOR_PRUNE_PAUSE`` seconds between batches so the claim and the outcome writes
keep the database, and renews its lease at each batch. The retentions are those of
``gator_prune`` (``GATOR_PRUNE_SUCCEEDED_AFTER``, ``GATOR_PRUNE_CANCELLED_AFTER``); dead
jobs are never pruned automatically (they wait for an operator: ``gator_prune --dead``).

The same pass prunes the rate-limit ledger (``django_gator_flow_start``, see
``engines/flow.py``): the limited claim deletes a scope's rows that left its window only
when it starts another job of that scope, so the rows of a key that stops getting jobs (an
account that went quiet, a user who left) would stay for ever, and the table would grow
with every key ever used. The pass deletes the rows no window counts any more: those of
each limited job class and each rate-limited queue older than its window, and any other
row older than the longest window a rate can have (an hour). A claim of the scope would
delete the same rows (it deletes those older than its window): the pass only does it for
the scopes no claim comes back to.

The pruner is a thread of its own, not a step of the heartbeat: a long pass must never
delay a heartbeat (a late heartbeat gets a worker's jobs rescued). ``GATOR_AUTO_PRUNE =
False`` turns it off; burst workers never prune.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import close_old_connections

from django_gator import conf
from django_gator.engines.base import Engine
from django_gator.engines.flow import key_scope, queue_scope
from django_gator.limits import UNITS, parse_rate
from django_gator.models import FlowStart, Job, JobState, Lease, Queue
from django_gator.registry import registered_jobs
from django_gator.worker.retrier import drop_connection

logger = logging.getLogger("django_gator.worker")

#: The states pruned automatically, with their retention's accessor.
RETENTIONS: tuple[tuple[JobState, Callable[[], float]], ...] = (
    (JobState.SUCCEEDED, conf.prune_succeeded_after),
    (JobState.CANCELLED, conf.prune_cancelled_after),
)
#: A holder that stopped renewing (it died, or its database connection did) loses the lease
#: after this many seconds at least, or after two intervals if that is longer.
MIN_LEASE_SECONDS = 60.0
#: The longest window of a rate limit ("N/h"): no claim counts a ledger row older than it.
LONGEST_WINDOW = max(UNITS.values())


class Pruner:
    """Automatic pruning for worker ``worker_id``: :meth:`run` is the thread's body;
    :meth:`prune_once` one pass (if this worker gets the lease)."""

    def __init__(self, engine: Engine, worker_id: str, rng: random.Random | None = None) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.rng = rng or random.Random()
        self.deleted = 0  # rows this worker's passes deleted (for the logs and tests)
        self.ledger_deleted = 0  # rate-limit ledger rows they deleted

    def lease_seconds(self) -> float:
        return max(MIN_LEASE_SECONDS, 2 * conf.prune_interval())

    def run(self, stopped: Callable[[float], bool]) -> None:
        """Prune every interval (from 0.5 to 1.5 times it, so a fleet started together
        spreads its tries) until ``stopped(seconds)`` (which waits) is true."""
        while not stopped(conf.prune_interval() * self.rng.uniform(0.5, 1.5)):
            try:
                self.prune_once(stopped)
            except Exception:
                logger.exception("Automatic pruning failed worker=%s", self.worker_id)
                drop_connection(self.engine.alias)

    def take_lease(self) -> bool:
        return Lease.objects.using(self.engine.alias).take(
            Lease.PRUNE, self.worker_id, now=self.engine.db_now(), seconds=self.lease_seconds()
        )

    def prune_once(self, stopped: Callable[[float], bool] = lambda _: False) -> int | None:
        """One pass: None if another worker holds the lease; else the rows deleted. Stops
        early when ``stopped(pause)`` is true or the lease is lost."""
        close_old_connections()
        if not conf.auto_prune() or not self.take_lease():
            return None
        alias = self.engine.alias
        batch_size = conf.prune_batch_size()
        deleted = 0
        ledger = self.prune_flow_starts(stopped)
        self.ledger_deleted += ledger
        if ledger:
            logger.info(
                "Pruned rate-limit ledger rows deleted=%s worker=%s", ledger, self.worker_id
            )
        for state, retention in RETENTIONS:
            while True:
                try:
                    before = self.engine.db_now() - timedelta(seconds=retention())
                except OverflowError:
                    break  # a retention longer than the calendar: nothing is old enough
                old = Job.objects.using(alias).filter(state=state).finished(before=before)
                pruned = old.prune(batch_size=batch_size, max_batches=1)
                deleted += pruned.deleted
                if pruned.deleted < batch_size:
                    break  # nothing more of this state is old enough
                if stopped(conf.prune_pause()) or not self.take_lease():
                    self._done(deleted)
                    return deleted
        self._done(deleted)
        return deleted

    def flow_windows(self) -> list[tuple[dict[str, str], int]]:
        """(filter on the ledger's scope, window in seconds) of every scope whose window
        is shorter than the longest: the rate-limited job classes this worker knows, and
        the queues whose row has a rate limit."""
        windows: list[tuple[dict[str, str], int]] = []
        for name, job_class in sorted(registered_jobs().items()):
            if not job_class._gator_limited:
                continue
            rate = parse_rate(job_class.rate_limit)
            if rate is not None and rate.seconds < LONGEST_WINDOW:
                windows.append(({"scope__startswith": key_scope(name, "")}, rate.seconds))
        limited = Queue.objects.using(self.engine.alias).exclude(rate_limit="")
        for queue, rate_text in limited.values_list("name", "rate_limit"):
            try:
                rate = parse_rate(rate_text)
            except ValueError:
                continue  # the claim refuses it too, and logs it
            if rate is not None and rate.seconds < LONGEST_WINDOW:
                windows.append(({"scope": queue_scope(queue)}, rate.seconds))
        return windows

    def prune_flow_starts(self, stopped: Callable[[float], bool] = lambda _: False) -> int:
        """Delete the rate-limit ledger's rows that no claim counts any more; returns how
        many. The ids are read first and deleted by primary key, so the delete locks only
        those rows (a claim that counts or inserts the ledger's rows meanwhile is never
        held up), at most ``GATOR_PRUNE_BATCH_SIZE`` per transaction."""
        now = self.engine.db_now()
        deleted = 0
        for scope, seconds in [*self.flow_windows(), ({}, LONGEST_WINDOW)]:
            deleted += self._delete_older(scope, now - timedelta(seconds=seconds), stopped)
        return deleted

    def _delete_older(
        self, scope: dict[str, str], before: datetime, stopped: Callable[[float], bool]
    ) -> int:
        ledger = FlowStart.objects.using(self.engine.alias)
        batch_size = conf.prune_batch_size()
        deleted = 0
        while True:
            old = ledger.filter(started_at__lte=before, **scope)
            ids = list(old.order_by("id").values_list("id", flat=True)[:batch_size])
            if ids:
                count, _ = ledger.filter(id__in=ids, started_at__lte=before).delete()
                deleted += count
            if len(ids) < batch_size or stopped(conf.prune_pause()):
                return deleted

    def _done(self, deleted: int) -> None:
        self.deleted += deleted
        if deleted:
            logger.info("Pruned finished jobs deleted=%s worker=%s", deleted, self.worker_id)
