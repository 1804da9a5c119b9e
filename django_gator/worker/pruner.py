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

The same pass prunes the rate-limit ledger (``django_gator_flow_start``, see
``engines/flow.py``): the limited claim deletes a scope's rows that left its window only
when it starts another job of that scope, so the rows of a key that stops getting jobs (an
account that went quiet, a user who left) would stay for ever, and the table would grow
with every key ever used. The pass deletes the rows of the scopes that went quiet: those
whose newest row is older than the scope's window (the job class's or the queue's rate;
an hour, the longest a rate can have, for a scope this worker knows no rate of) by
IDLE_MARGIN more. It leaves the scopes in use to their claims, which delete their old rows
under the lock of their queue's row, in the order they count them: a claim reads its time
when its statement starts, before it waits for that lock, so a row the pass deleted on its
own clock just as it left the window could still be one the waiting claim would count,
and the claim would start one job too many (a soak run found one). A scope's rows are
deleted only once it has been quiet for its window and the margin, so a claim would have
to wait for its queue's lock longer than the margin to miss one.

With partitioned storage (``GATOR_PARTITIONING``, PostgreSQL; engines/partitions.py) the
lease holder creates the time partitions of finished jobs ahead and drops those whose end
is past the longer of the two retentions, instead of deleting succeeded and cancelled jobs
row by row; it logs an error when finished jobs went to the default partition. The creation
goes on with ``GATOR_AUTO_PRUNE = False`` (only the drops stop).

The pruner is a thread of its own, not a step of the heartbeat: a long pass must never
delay a heartbeat (a late heartbeat gets a worker's jobs rescued). ``GATOR_AUTO_PRUNE =
False`` turns it off; burst workers never prune.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import close_old_connections, models

from django_gator import conf
from django_gator.engines import JobEngine
from django_gator.engines.flow_ledger import key_scope, queue_scope
from django_gator.engines.partitions import PartitioningError, Partitions
from django_gator.limits import UNITS, parse_rate
from django_gator.models import Batch, FlowStart, Job, JobState, Lease, Queue, WorkflowRun
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
#: Seconds a scope of the rate-limit ledger must have been quiet beyond its window before
#: the pass deletes its rows (see the module's docstring).
IDLE_MARGIN = 300.0


class Pruner:
    """Automatic pruning for worker ``worker_id``: :meth:`run` is the thread's body;
    :meth:`prune_once` one pass (if this worker gets the lease)."""

    def __init__(self, engine: JobEngine, worker_id: str, rng: random.Random | None = None) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.rng = rng or random.Random()
        self.deleted = 0  # jobs this worker's passes deleted (for the logs and tests)
        #: Batches and workflows (their steps with them) those passes deleted.
        self.deleted_batches = 0
        self.deleted_workflows = 0
        self.ledger_deleted = 0  # rate-limit ledger rows they deleted
        #: Time partitions of finished jobs created and dropped (GATOR_PARTITIONING).
        self.partitions_created = 0
        self.partitions_dropped = 0

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
        partitioned = conf.partitioning() is not None and Partitions.available(self.engine.alias)
        if not (conf.auto_prune() or partitioned) or not self.take_lease():
            return None
        if partitioned:
            partitioned = self.keep_partitions()
        if not conf.auto_prune():
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
        for state, retention in () if partitioned else RETENTIONS:
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

    def keep_partitions(self) -> bool:
        """Partitioned storage (GATOR_PARTITIONING): create the time partitions ahead, drop
        those whose every job is past its retention (the longer of the succeeded and
        cancelled ones; with GATOR_AUTO_PRUNE only), and say loudly if finished jobs went
        to the default partition. A plain table is an error in the log that names the
        conversion; its rows are then pruned by DELETE as without partitioning."""
        partitions = Partitions(self.engine.alias)
        now = self.engine.db_now()
        try:
            created = partitions.ensure(now, conf.partitioning() or "day")
        except PartitioningError as exc:
            logger.error("Partitioned storage unavailable worker=%s: %s", self.worker_id, exc)
            return False
        self.partitions_created += len(created)
        partitions.check_default()
        if conf.auto_prune():
            retention = max(conf.prune_succeeded_after(), conf.prune_cancelled_after())
            try:
                cutoff = now - timedelta(seconds=retention)
            except OverflowError:
                return True  # a retention longer than the calendar: nothing is old enough
            self.partitions_dropped += len(partitions.drop_before(cutoff))
        return True

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

    def flow_windows(self) -> list[tuple[dict[str, str], int]]:
        """(filter on the ledger's scope, window in seconds) of every scope whose window
        is shorter than the longest: the rate-limited job classes this worker knows, and
        the queues whose row has a rate limit."""
        windows: list[tuple[dict[str, str], int]] = []
        for name, job_class in sorted(registered_jobs().items()):
            if not job_class.traits.is_limited:
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
        """Delete the rows of the rate-limit ledger's quiet scopes; returns how many. The
        ids are read first and deleted by primary key, so the delete locks only those rows
        (a claim that counts or inserts the ledger's rows meanwhile is never held up), at
        most ``GATOR_PRUNE_BATCH_SIZE`` per transaction."""
        now = self.engine.db_now()
        deleted = 0
        for scope, seconds in [*self.flow_windows(), ({}, LONGEST_WINDOW)]:
            before = now - timedelta(seconds=seconds + IDLE_MARGIN)
            deleted += self._delete_quiet(scope, before, stopped)
        return deleted

    def _delete_quiet(
        self, scope: dict[str, str], before: datetime, stopped: Callable[[float], bool]
    ) -> int:
        """Delete the rows of the scopes (among ``scope``) whose newest row is no newer
        than ``before``."""
        ledger = FlowStart.objects.using(self.engine.alias)
        batch_size = conf.prune_batch_size()
        quiet = list(
            ledger.filter(**scope)
            .values("scope")
            .annotate(newest=models.Max("started_at"))
            .filter(newest__lte=before)
            .values_list("scope", flat=True)[: 10 * batch_size]  # the next pass goes on
        )
        deleted = 0
        for start in range(0, len(quiet), batch_size):
            scopes = quiet[start : start + batch_size]
            while True:
                # started_at again: a claim may have started a job of one of them since.
                old = ledger.filter(scope__in=scopes, started_at__lte=before)
                ids = list(old.order_by("id").values_list("id", flat=True)[:batch_size])
                if ids:
                    count, _ = ledger.filter(id__in=ids, started_at__lte=before).delete()
                    deleted += count
                if stopped(conf.prune_pause()):
                    return deleted
                if len(ids) < batch_size:
                    break
        return deleted

    def _done(self, deleted: int) -> None:
        self.deleted += deleted
        if deleted:
            logger.info("Pruned finished jobs deleted=%s worker=%s", deleted, self.worker_id)
