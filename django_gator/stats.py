"""Queue and worker figures for ``manage.py gator_status`` (and the admin).

Every figure is computed against the database clock (read once per call, so the numbers of
one report agree with each other) and with one ``GROUP BY`` query per kind of figure,
whatever the number of queues. The queries are written for a jobs table of millions of
rows, most of them finished:

- *ready*, *scheduled*, *running* and *dead* come from the queue gauges' one statement,
  which reads partial indexes only (waiting and failed rows; running rows by queue; dead
  rows by queue) on PostgreSQL and SQLite, index-only scans when the table is vacuumed;
  finished rows never enter them (engines/gauges.py).
- *failed* walks the failed rows' index; the last-hour counts add up the workers'
  tallies of the last hour (django_gator.tallies: rows per minute and queue, however many
  jobs ended in that hour).
- Succeeded and cancelled jobs are not counted per queue unless asked for
  (``exact=True``): that would read every finished row. :func:`estimated_total` gives the
  size of the whole table from the database's statistics instead.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db.models import Count

from django_gator import conf
from django_gator.declared_limits import JobLimit, job_limits
from django_gator.engines import get_engine, reads
from django_gator.models import Job, JobState, Queue, Worker
from django_gator.tallies import finished_since

if TYPE_CHECKING:
    from django_gator.engines.gauges import QueueGauge

#: The window of the ``*_last_hour`` counts, in seconds.
LAST_HOUR = 3600.0


@dataclass
class QueueStats:
    """One queue's figures. Counts are exact unless noted.

    ``ready``: waiting and failed jobs whose ``next_execution_at`` has passed (a worker may
    claim them now). ``scheduled``: waiting and failed jobs due later. ``failed``: jobs that
    failed and will be retried; they are also counted in ``ready`` or ``scheduled``.
    ``oldest_due_at`` / ``oldest_due_age``: the earliest ``next_execution_at`` of the ready
    jobs and its age in seconds (how long the queue's head has waited); None when nothing is
    ready. ``oldest_running_at`` / ``oldest_running_age``: the start of the oldest running
    job's claim (``locked_at``) and how long it has run, in seconds; None when none runs.
    ``succeeded_last_hour`` / ``dead_last_hour``: attempts the workers wrote as succeeded
    or dead within the last hour (their tallies, by the minute: see
    :mod:`django_gator.tallies`). ``succeeded`` / ``cancelled``: totals, only with
    ``queue_stats(exact=True)``, else None. ``paused``: no worker claims from the queue
    (see :func:`django_gator.pause_queue`); ``paused_at`` and ``paused_by`` say since when
    and who paused it (None and "" when it is not paused). ``concurrency`` and
    ``rate_limit``: the queue's limits (None and "" when it has none); ``limits_by``: the
    operator who set them ("" when they come from ``GATOR_QUEUES``).
    """

    queue: str
    ready: int = 0
    scheduled: int = 0
    running: int = 0
    failed: int = 0
    dead: int = 0
    oldest_due_at: datetime | None = None
    oldest_due_age: float | None = None
    oldest_running_at: datetime | None = None
    oldest_running_age: float | None = None
    succeeded_last_hour: int = 0
    dead_last_hour: int = 0
    succeeded: int | None = None
    cancelled: int | None = None
    paused: bool = False
    paused_at: datetime | None = None
    paused_by: str = ""
    #: Flow control: the queue's limits (None / "": none) and who set them ("": settings).
    concurrency: int | None = None
    rate_limit: str = ""
    limits_by: str = ""
    #: The limits of the job classes whose queue this is (``concurrency_limit`` and
    #: ``rate_limit``, often per key), in job name order.
    job_limits: list[JobLimit] = field(default_factory=list)

    @property
    def limit_text(self) -> str:
        """The queue's own limits: ``running/limit`` and the rate ("" if none)."""
        parts = []
        if self.concurrency is not None:
            parts.append(f"{self.running}/{self.concurrency}")
        if self.rate_limit:
            parts.append(self.rate_limit)
        return ", ".join(parts)

    @property
    def job_limit_text(self) -> str:
        """Its job classes' limits: ``SyncAccount 1 at once per key, 100/m per key``."""
        return "; ".join(limit.text for limit in self.job_limits)

    @property
    def limits_text(self) -> str:
        """Every limit on the queue's jobs, the queue's own first (for the commands)."""
        return "; ".join(text for text in (self.limit_text, self.job_limit_text) if text)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: datetimes as ISO 8601 strings."""
        data = asdict(self)
        data["oldest_due_at"] = _iso(self.oldest_due_at)
        data["oldest_running_at"] = _iso(self.oldest_running_at)
        data["paused_at"] = _iso(self.paused_at)
        return data


@dataclass
class WorkerStats:
    """A live worker: its heartbeat is within ``GATOR_HEARTBEAT_TIMEOUT`` of database now
    (older, it is lost: its jobs are rescued and its row deleted, and it is not listed).

    ``queues``: ``[[name, weight], ...]`` as the worker registered them (empty: every
    queue). ``heartbeat_age``: seconds since its last heartbeat. ``stale``: the heartbeat is
    older than :func:`stale_after` (a live worker beats every
    ``GATOR_HEARTBEAT_INTERVAL``): it is frozen, cut off from the database, or dead and not
    yet declared lost, and its running jobs wait. ``running_job_ids``: the jobs it holds in
    state ``running``, lowest id first. ``supervisor``: the id of the ``gator_worker
    --processes`` supervisor that started it (empty if none).
    """

    id: str
    hostname: str
    pid: int
    queues: list[Any]
    concurrency: int
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_age: float
    running_job_ids: list[int] = field(default_factory=list)
    #: The id of the ``gator_worker --processes`` supervisor that started it, or "".
    supervisor: str = ""
    stale: bool = False

    @property
    def running(self) -> int:
        return len(self.running_job_ids)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["started_at"] = _iso(self.started_at)
        data["heartbeat_at"] = _iso(self.heartbeat_at)
        data["running"] = self.running
        return data


def queue_stats(
    alias: str | None = None, *, exact: bool = False, now: datetime | None = None
) -> list[QueueStats]:
    """Per-queue figures (see :class:`QueueStats`), sorted by queue name.

    A queue appears when it has waiting, failed, running or dead jobs, or jobs that
    succeeded within the last hour (or, with ``exact``, any succeeded or cancelled job), or
    a row of its own in the queue table (it was ever paused).

    Four queries whatever the number of queues (five with ``exact``): the queue gauges'
    one statement (ready/scheduled/oldest, running, dead and the database's now, from
    partial indexes; see engines/gauges.py), the failed jobs, the tallies of the last hour
    for the recent outcomes, and the queue table. ``exact=True``
    also counts every succeeded and cancelled row, which reads all of them: keep it for
    small tables. ``now`` (default: the database's clock) dates the oldest due job's age.
    """
    alias = alias or conf.database()
    db_now, gauges = get_engine(alias).queue_gauges()
    if now is None:
        now = db_now
    jobs = Job.objects.using(alias).order_by()
    by_queue: dict[str, QueueStats] = {}

    def entry(queue: str) -> QueueStats:
        stats = by_queue.get(queue)
        if stats is None:
            stats = by_queue[queue] = QueueStats(queue=queue)
            if exact:
                stats.succeeded = stats.cancelled = 0
        return stats

    for gauge in gauges:
        _apply_gauge(entry(gauge.queue), gauge, now)
    failed_rows = jobs.filter(state=JobState.FAILED).values("queue").annotate(count=Count("*"))
    for failed in failed_rows:
        entry(failed["queue"]).failed = failed["count"]
    since = now - timedelta(seconds=LAST_HOUR)
    for _minute, name, succeeded, dead in finished_since(alias, since):
        recent = entry(name)
        recent.succeeded_last_hour += succeeded
        recent.dead_last_hour += dead
    for queue in Queue.objects.using(alias):
        _apply_queue_row(entry(queue.name), queue)
    for queue_name, limits in job_limits().items():
        if queue_name in by_queue:  # a limited class's idle queue is not listed for it
            by_queue[queue_name].job_limits = limits
    if exact:
        final_rows = (
            jobs.filter(state__in=(JobState.SUCCEEDED, JobState.CANCELLED))
            .values("queue", "state")
            .annotate(count=Count("id"))
        )
        for final in final_rows:
            setattr(entry(final["queue"]), str(final["state"]), final["count"])
    return [by_queue[name] for name in sorted(by_queue)]


def _apply_gauge(stats: QueueStats, gauge: QueueGauge, now: datetime) -> None:
    """A queue's gauges (ready, scheduled, running, dead, the oldest due and running jobs
    and their ages at ``now``) into its figures."""
    stats.ready = gauge.ready
    stats.scheduled = gauge.scheduled
    stats.running = gauge.running
    stats.dead = gauge.dead
    if gauge.oldest_due_at is not None:
        stats.oldest_due_at = gauge.oldest_due_at
        stats.oldest_due_age = max(0.0, (now - gauge.oldest_due_at).total_seconds())
    if gauge.oldest_running_at is not None:
        stats.oldest_running_at = gauge.oldest_running_at
        stats.oldest_running_age = max(0.0, (now - gauge.oldest_running_at).total_seconds())


def _apply_queue_row(stats: QueueStats, queue: Queue) -> None:
    """A queue's row (pause, limits) into its figures."""
    stats.paused = queue.paused
    stats.paused_at = queue.paused_at if queue.paused else None
    stats.paused_by = queue.paused_by if queue.paused else ""
    stats.concurrency = queue.concurrency
    stats.rate_limit = queue.rate_limit
    stats.limits_by = queue.limits_by


def estimated_total(alias: str | None = None) -> tuple[int, bool]:
    """The number of rows in the jobs table: ``(count, exact)``.

    PostgreSQL: ``pg_class.reltuples``, kept by VACUUM and ANALYZE (autovacuum), so it lags
    behind recent inserts and deletes; an exact ``COUNT(*)`` only when the table was never
    analyzed. MySQL/MariaDB: ``information_schema.TABLES.TABLE_ROWS``, InnoDB's estimate
    (it can be off by tens of percent, and MySQL 8 caches it for
    ``information_schema_stats_expiry`` seconds). SQLite: an exact ``COUNT(*)``; SQLite keeps
    no row estimate, and its tables are small enough.
    """
    alias = alias or conf.database()
    estimate = reads.row_estimate(get_engine(alias), Job._meta.db_table)
    if estimate is not None:
        return estimate, False
    return Job.objects.using(alias).count(), True


def stale_after() -> float:
    """Seconds after which a live worker's heartbeat is stale: half of
    ``GATOR_HEARTBEAT_TIMEOUT``, the gap after which a worker's lifeline says its own
    heartbeats stalled (a worker beats every ``GATOR_HEARTBEAT_INTERVAL``, less than that)."""
    return conf.heartbeat_timeout() / 2


def workers(alias: str | None = None, *, now: datetime | None = None) -> list[WorkerStats]:
    """Live workers (heartbeat within ``GATOR_HEARTBEAT_TIMEOUT`` of database now), oldest
    first, each with the ids of the jobs it is running. Two queries."""
    alias = alias or conf.database()
    if now is None:
        now = get_engine(alias).db_now()
    cutoff = now - timedelta(seconds=conf.heartbeat_timeout())
    stale = stale_after()
    live = [
        WorkerStats(
            id=w.id,
            hostname=w.hostname,
            pid=w.pid,
            queues=list(w.queues or []),
            concurrency=w.concurrency,
            started_at=w.started_at,
            heartbeat_at=w.heartbeat_at,
            heartbeat_age=max(0.0, (now - w.heartbeat_at).total_seconds()),
            supervisor=w.supervisor,
            stale=(now - w.heartbeat_at).total_seconds() > stale,
        )
        for w in Worker.objects.using(alias)
        .filter(heartbeat_at__gte=cutoff)
        .order_by("started_at", "id")
    ]
    if live:
        by_id = {w.id: w for w in live}
        running = (
            Job.objects.using(alias)
            .filter(state=JobState.RUNNING, reserved_by__in=list(by_id))
            .order_by("id")
            .values_list("reserved_by", "id")
        )
        for owner, job_id in running:
            if owner in by_id:
                by_id[owner].running_job_ids.append(job_id)
    return live


@dataclass
class LongRunner:
    """A job running longer than some threshold: its id, name, queue, worker
    (``reserved_by``), the start of its claim (``locked_at``) and its age in seconds, and
    ``handbacks``, the times stopping workers gave it back before."""

    id: int
    name: str
    queue: str
    worker: str
    locked_at: datetime
    age: float
    handbacks: int


def long_runners(
    seconds: float, alias: str | None = None, *, now: datetime | None = None, limit: int = 100
) -> list[LongRunner]:
    """The running jobs whose claim is older than ``seconds`` (by the database clock, or
    ``now``), oldest first, at most ``limit``: one query of the running rows."""
    alias = alias or conf.database()
    if now is None:
        now = get_engine(alias).db_now()
    rows = (
        Job.objects.using(alias)
        .stale(before=now - timedelta(seconds=seconds))
        .order_by("locked_at", "id")
        .values_list("id", "name", "queue", "reserved_by", "locked_at", "handbacks")[:limit]
    )
    return [
        LongRunner(
            id=job_id,
            name=name,
            queue=queue,
            worker=worker or "",
            locked_at=locked_at,
            age=max(0.0, (now - locked_at).total_seconds()),
            handbacks=handbacks,
        )
        for job_id, name, queue, worker, locked_at, handbacks in rows
        if locked_at is not None  # every claim sets it
    ]


def unserved_queues(queues: list[QueueStats], live: list[WorkerStats]) -> list[str]:
    """The queues of ``queues`` that have jobs due now and no live worker (of ``live``,
    as :func:`workers` returns them) to run them, sorted. A worker without a queue list
    (started without ``-q``) serves every queue. A paused queue is not counted: its jobs
    wait because it is paused."""
    queues = [q for q in queues if not q.paused]
    served: set[str] = set()
    for worker in live:
        if not worker.queues:
            return []
        for entry in worker.queues:
            served.add(str(entry[0] if isinstance(entry, list | tuple) else entry))
    return sorted(q.queue for q in queues if q.ready and q.queue not in served)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
