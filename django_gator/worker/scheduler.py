"""The scheduler loop that every ``gator_worker`` runs: it dispatches the due occurrences of
the cron schedules in the ``Schedule`` table.

Any number of workers may run it at once. Each occurrence is dispatched in a transaction
that first inserts its ``ScheduledRun`` row, unique per (schedule, occurrence time): a
second worker's insert fails, rolls back to its savepoint and dispatches nothing. So an
occurrence runs once however many schedulers saw it, and runs as long as one worker lives.

With several job databases (GATOR_QUEUE_DATABASES) each database's schedulers hold the
declared schedules whose jobs' queue lives there, and no other.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import IntegrityError, close_old_connections, transaction
from django.db.models import Q

from django_gator import conf
from django_gator.databases import for_queue
from django_gator.engines import get_engine, reads
from django_gator.exceptions import JobNotRegistered
from django_gator.logutil import safe
from django_gator.models import Job, MisfirePolicy, Schedule, ScheduledRun, ScheduleSource
from django_gator.queueable import get_job_class
from django_gator.schedules import (
    ScheduleSpec,
    declared_schedules,
    next_occurrence,
    occurrences,
)
from django_gator.states import ACTIVE_STATES
from django_gator.worker.retrier import backoff, drop_connection

logger = logging.getLogger("django_gator.scheduler")

#: Occurrences looked at per schedule and look, at most (after a very long downtime).
MAX_OCCURRENCES = 100_000
#: Seconds between two prunes of old ScheduledRun rows, per worker.
PRUNE_EVERY = 3600.0
#: Seconds between two log lines about the same schedule whose job is unknown here.
WARN_EVERY = 600.0


def is_registered_name(name: str) -> bool:
    try:
        get_job_class(name)
    except JobNotRegistered:
        return False
    return True


class Scheduler:
    """Dispatches due occurrences. ``clock`` returns the current aware datetime (the
    database's by default); tests pass their own."""

    def __init__(self, alias: str | None = None, clock: Callable[[], datetime] | None = None):
        self.alias = alias or conf.database()
        configured = conf.scheduler_clock()
        self._clock = clock or configured or get_engine(self.alias).db_now
        #: Whether "now" is the database's: then :meth:`look` reads it with the schedules.
        self._db_clock = not (clock or configured)
        self._last_prune = float("-inf")
        self._warned: dict[int, float] = {}

    def now(self) -> datetime:
        return self._clock()

    # -- declared schedules ----------------------------------------------------------------
    def sync_declared(self) -> None:
        """Write the schedules declared in code and GATOR_SCHEDULES to the table: new ones
        are created, changed ones updated (a new timing counts from now), and code or
        settings schedules that are no longer declared are disabled."""
        specs = [spec for spec in declared_schedules() if self._held_here(spec)]
        names = set()
        schedules = Schedule.objects.using(self.alias)
        for spec in specs:
            names.add(spec.name)
            fields = {
                "job_name": spec.job_name,
                "cron": spec.cron,
                "args": spec.args,
                "kwargs": spec.kwargs,
                "queue": spec.queue or "",
                "priority": spec.priority,
                "timezone": spec.timezone,
                "misfire": spec.misfire,
                "catch_up_limit": spec.catch_up_limit,
                "overlap": spec.overlap,
                "source": spec.source,
                "enabled": True,
            }
            existing = schedules.filter(name=spec.name).first()
            if existing is None:
                try:
                    with transaction.atomic(using=self.alias):
                        Schedule(name=spec.name, **fields).save(using=self.alias)
                    logger.info("Schedule created name=%s cron=%s", safe(spec.name), spec.cron)
                except IntegrityError:
                    pass  # another worker created it just now
                continue
            changed = {k: v for k, v in fields.items() if getattr(existing, k) != v}
            if changed:
                for key, value in changed.items():
                    setattr(existing, key, value)
                existing.save(using=self.alias)
                logger.info(
                    "Schedule updated name=%s fields=%s", safe(spec.name), ",".join(changed)
                )
        stale = schedules.filter(
            source__in=(ScheduleSource.CODE, ScheduleSource.SETTINGS), enabled=True
        ).exclude(name__in=names)
        for schedule in stale:
            schedule.enabled = False
            schedule.save(using=self.alias, update_fields=["enabled"])
            logger.warning(
                "Schedule disabled: no longer declared in code or settings name=%s",
                safe(schedule.name),
            )

    def _held_here(self, spec: ScheduleSpec) -> bool:
        """Whether the schedule ``spec`` belongs to this scheduler's database: the one its
        jobs' queue lives in (GATOR_QUEUE_DATABASES), so that each occurrence is recorded
        and dispatched within one database, by one database's schedulers."""
        if not conf.get("GATOR_QUEUE_DATABASES"):
            return True
        try:
            queue = spec.queue or get_job_class(spec.job_name).queue
        except JobNotRegistered:
            return self.alias == conf.database()
        return for_queue(queue) == self.alias

    # -- the loop's body -------------------------------------------------------------------
    def look(self) -> tuple[datetime, datetime | None]:
        """(now, the earliest next run of an enabled schedule or None) in one statement:
        what an idle worker's scheduler costs the database per look."""
        engine = get_engine(self.alias)
        db_now, earliest = reads.schedules_look(
            engine, Schedule._meta.db_table, with_now=self._db_clock
        )
        return (db_now if db_now is not None else self.now()), earliest

    def tick(self) -> datetime | None:
        """Handle every due schedule once; returns the earliest next run (None if none).
        When nothing is due that is the one statement of :meth:`look`."""
        now, earliest = self.look()
        if earliest is None or earliest > now:
            self._prune(now)
            return earliest
        due = Schedule.objects.using(self.alias).filter(enabled=True, next_run_at__lte=now)
        for schedule in due.order_by("next_run_at"):
            try:
                self.handle(schedule, now)
            except Exception:
                logger.exception("Schedule failed name=%s", safe(schedule.name))
        self._prune(now)
        upcoming = (
            Schedule.objects.using(self.alias)
            .filter(enabled=True, next_run_at__isnull=False)
            .order_by("next_run_at")
            .values_list("next_run_at", flat=True)
            .first()
        )
        return upcoming

    def handle(self, schedule: Schedule, now: datetime) -> list[ScheduledRun]:
        """Dispatch ``schedule``'s occurrences due by ``now`` per its misfire policy."""
        if not is_registered_name(schedule.job_name):
            # Perhaps a worker running older code during a deploy: leave the occurrence to
            # a worker that knows the job (it is a misfire if none does).
            if time.monotonic() - self._warned.get(schedule.pk, float("-inf")) > WARN_EVERY:
                self._warned[schedule.pk] = time.monotonic()
                logger.error(
                    "Schedule's job is not registered in this worker name=%s job=%s",
                    safe(schedule.name),
                    safe(schedule.job_name),
                )
            return []
        after = schedule.anchor_at
        if schedule.last_run_at is not None and schedule.last_run_at > after:
            after = schedule.last_run_at
        keep = max(schedule.catch_up_limit, 1) + 1
        recent: deque[datetime] = deque(maxlen=keep)
        latest: datetime | None = None
        for count, instant in enumerate(occurrences(schedule.cron, schedule.timezone, after, now)):
            recent.append(instant)
            latest = instant
            if count >= MAX_OCCURRENCES:
                break
        runs: list[ScheduledRun] = []
        if latest is not None:
            for instant in self._to_run(schedule, list(recent), now):
                run = self.dispatch_occurrence(schedule, instant)
                if run is not None:
                    runs.append(run)
        self._advance(schedule, latest)
        return runs

    def _to_run(
        self, schedule: Schedule, instants: list[datetime], now: datetime
    ) -> list[datetime]:
        grace = timedelta(seconds=conf.misfire_grace())
        fresh = [i for i in instants if now - i <= grace]
        missed = [i for i in instants if now - i > grace]
        if schedule.misfire == MisfirePolicy.SKIP:
            chosen = fresh
        elif schedule.misfire == MisfirePolicy.CATCH_UP:
            chosen = (missed + fresh)[-schedule.catch_up_limit :]
        else:  # once
            chosen = fresh or missed[-1:]
        skipped = len(instants) - len(chosen)
        if missed and skipped > 0:
            logger.warning(
                "Schedule missed occurrences name=%s missed=%s policy=%s running=%s",
                safe(schedule.name),
                len(missed),
                schedule.misfire,
                len(chosen),
            )
        return chosen

    def dispatch_occurrence(self, schedule: Schedule, instant: datetime) -> ScheduledRun | None:
        """Dispatch one occurrence, unless another worker did (None then)."""
        job_class = get_job_class(schedule.job_name)
        with transaction.atomic(using=self.alias):
            try:
                with transaction.atomic(using=self.alias):
                    run = ScheduledRun(schedule_id=schedule.pk, occurrence_at=instant)
                    run.save(using=self.alias)
            except IntegrityError:
                return None  # handled by another worker
            if not schedule.overlap and self._previous_active(schedule):
                run.skipped = True
                run.save(using=self.alias, update_fields=["skipped"])
                logger.info(
                    "Schedule occurrence skipped: previous run unfinished name=%s at=%s",
                    safe(schedule.name),
                    instant.isoformat(),
                )
                return run
            job = job_class.dispatch(
                *schedule.args,
                queue=schedule.queue or None,
                priority=schedule.priority,
                on_commit=False,
                **schedule.kwargs,
            )
            run.job_id = job.pk
            run.save(using=self.alias, update_fields=["job_id"])
            Schedule.objects.using(self.alias).filter(pk=schedule.pk).update(last_job_id=job.pk)
            schedule.last_job_id = job.pk
        logger.info(
            "Schedule dispatched name=%s at=%s job=%s",
            safe(schedule.name),
            instant.isoformat(),
            job.pk,
        )
        return run

    def _previous_active(self, schedule: Schedule) -> bool:
        current = (
            Schedule.objects.using(self.alias)
            .filter(pk=schedule.pk)
            .values_list("last_job_id", flat=True)
            .first()
        )
        if current is None:
            return False
        return Job.objects.using(self.alias).filter(pk=current, state__in=ACTIVE_STATES).exists()

    def _advance(self, schedule: Schedule, latest: datetime | None) -> None:
        """Move last_run_at forward (never back: another worker may be ahead of us) and set
        next_run_at from it."""
        after = schedule.anchor_at
        if schedule.last_run_at is not None and schedule.last_run_at > after:
            after = schedule.last_run_at
        if latest is not None and latest > after:
            after = latest
        try:
            following: datetime | None = next_occurrence(schedule.cron, schedule.timezone, after)
        except ValueError:
            following = None
        rows = Schedule.objects.using(self.alias).filter(pk=schedule.pk, cron=schedule.cron)
        rows = rows.filter(timezone=schedule.timezone)  # an edit meanwhile wins
        if latest is not None:
            rows.filter(Q(last_run_at__isnull=True) | Q(last_run_at__lt=latest)).update(
                last_run_at=latest, next_run_at=following
            )
        else:
            rows.filter(last_run_at=schedule.last_run_at).update(next_run_at=following)

    def _prune(self, now: datetime) -> None:
        clock = time.monotonic()
        if clock - self._last_prune < PRUNE_EVERY:
            return
        self._last_prune = clock
        cutoff = now - timedelta(days=conf.schedule_run_retention_days())
        deleted, _ = (
            ScheduledRun.objects.using(self.alias).filter(occurrence_at__lt=cutoff).delete()
        )
        if deleted:
            logger.info("Pruned scheduled runs count=%s before=%s", deleted, cutoff.isoformat())


def run_scheduler(alias: str, stopped: threading.Event, worker_id: str) -> None:
    """The scheduler thread's body: tick every ``GATOR_SCHEDULER_INTERVAL`` seconds until
    ``stopped`` is set, starting again after a failure (the database may be down)."""
    scheduler: Scheduler | None = None
    failures = 0
    while not stopped.is_set():
        try:
            close_old_connections()
            if scheduler is None:
                candidate = Scheduler(alias)
                candidate.sync_declared()
                scheduler = candidate
            scheduler.tick()
            failures = 0
        except Exception:
            failures += 1
            logger.exception("Scheduler failed; retrying worker=%s", worker_id)
            drop_connection(alias)
            stopped.wait(backoff(failures))
            continue
        stopped.wait(conf.scheduler_interval())
