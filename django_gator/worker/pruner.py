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

After the jobs, the same pass deletes the batches and workflows none of whose jobs is
left, completed (a batch) or created (a workflow) more than
``GATOR_PRUNE_SUCCEEDED_AFTER`` ago, and never an unfinished one (see
:meth:`BatchQuerySet.finished` and :meth:`WorkflowRunQuerySet.finished`): one with a dead
member or step keeps that job, so it stays until an operator retries or prunes it.

The pruner is a thread of its own, not a step of the heartbeat: a long pass must never
delay a heartbeat (a late heartbeat gets a worker's jobs rescued). ``GATOR_AUTO_PRUNE =
False`` turns it off; burst workers never prune.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from datetime import timedelta

from django.db import close_old_connections

from django_gator import conf
from django_gator.engines.base import Engine
from django_gator.models import Batch, Job, JobState, Lease, WorkflowRun
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


class Pruner:
    """Automatic pruning for worker ``worker_id``: :meth:`run` is the thread's body;
    :meth:`prune_once` one pass (if this worker gets the lease)."""

    def __init__(self, engine: Engine, worker_id: str, rng: random.Random | None = None) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.rng = rng or random.Random()
        self.deleted = 0  # jobs this worker's passes deleted (for the logs and tests)
        #: Batches and workflows (their steps with them) those passes deleted.
        self.deleted_batches = 0
        self.deleted_workflows = 0

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
        """One pass: None if another worker holds the lease; else the jobs deleted (the
        batches and workflows deleted are counted in :attr:`deleted_batches` and
        :attr:`deleted_workflows`). Stops early when ``stopped(pause)`` is true or the
        lease is lost."""
        close_old_connections()
        if not conf.auto_prune() or not self.take_lease():
            return None
        alias = self.engine.alias
        batch_size = conf.prune_batch_size()
        deleted = 0
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
        self._prune_groups(stopped, batch_size)
        return deleted

    def _prune_groups(self, stopped: Callable[[float], bool], batch_size: int) -> None:
        """The batches and workflows left without a job, as the jobs are pruned."""
        alias = self.engine.alias
        try:
            before = self.engine.db_now() - timedelta(seconds=conf.prune_succeeded_after())
        except OverflowError:
            return
        for rows, counter in (
            (Batch.objects.using(alias), "deleted_batches"),
            (WorkflowRun.objects.using(alias), "deleted_workflows"),
        ):
            while True:
                pruned = rows.prune(before=before, batch_size=batch_size, max_batches=1)
                setattr(self, counter, getattr(self, counter) + pruned.deleted)
                if pruned.deleted:
                    logger.info(
                        "Pruned finished %s deleted=%s worker=%s",
                        rows.model._meta.verbose_name_plural,
                        pruned.deleted,
                        self.worker_id,
                    )
                if pruned.deleted < batch_size:
                    break
                if stopped(conf.prune_pause()) or not self.take_lease():
                    return

    def _done(self, deleted: int) -> None:
        self.deleted += deleted
        if deleted:
            logger.info("Pruned finished jobs deleted=%s worker=%s", deleted, self.worker_id)
