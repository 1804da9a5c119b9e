"""The queues' gauges in one statement: what a Prometheus scrape reads.

:meth:`GaugeStatements.queue_gauges` reads, per queue, the ready and scheduled jobs, the
running and dead ones, the earliest due time of the ready ones, and whether the queue is
paused, with the database's clock, in one ``SELECT`` of ``UNION ALL`` parts. Each part
reads one index, and only the rows of its states, so a table of millions of finished jobs
costs it nothing:

- ready and scheduled: on PostgreSQL and SQLite the claim's two partial indexes (jobs
  without a concurrency key in ``gator_job_ready``, jobs with one in
  ``gator_job_ready_keyed``), read alone (an index-only scan on a vacuumed PostgreSQL
  table); on MySQL/MariaDB, which have no partial indexes, the ``(state, queue)`` index to
  the ready rows, and those rows for their due time;
- running: the running jobs' ``(queue)`` partial index (MySQL: ``(state, queue)``), and
  those rows (as many as the fleet's executor slots) for the start of the oldest claim;
- dead: the dead rows' ``(queue)`` partial index (migration 0018; MySQL: ``(state,
  queue)``), so the dead jobs an operator keeps are counted without visiting them;
- paused: the queue table (a row per queue ever paused or limited);
- the database's now, a part of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django_gator.engines.core import KEYED_SQL, EngineCore
from django_gator.states import READY_SQL, RUNNING_SQL, JobState, live_sql, sql_literal

#: The parts' first column: which figures a row of the statement carries.
NOW, READY, RUNNING, DEAD, QUEUE = "now", "ready", "running", "dead", "queue"


@dataclass(slots=True)
class QueueGauge:
    """One queue's gauges. ``ready``: waiting and failed jobs due now; ``scheduled``: due
    later; ``oldest_due_at``: the earliest due time of the ready ones (None when none is
    ready); ``oldest_running_at``: the start of the oldest claim (``locked_at``) of the
    running ones (None when none runs); ``paused``: no worker claims from the queue."""

    queue: str
    ready: int = 0
    scheduled: int = 0
    running: int = 0
    dead: int = 0
    oldest_due_at: datetime | None = None
    oldest_running_at: datetime | None = None
    paused: bool = False


class GaugeStatements(EngineCore):
    """The one statement of the queues' gauges."""

    def ready_condition(self) -> str:
        raise NotImplementedError  # the claim's (Engine.ready_condition)

    def has_due_jobs(self, queues: Sequence[str] | None) -> bool:
        if queues is not None and not queues:
            return False
        where = [self.ready_condition(), f"next_execution_at <= {self.now_sql}"]
        where += [live_sql(self.now_sql), self.unpaused_sql("queue")]
        params: list[Any] = []
        if queues is not None:
            where.append("queue IN (" + ", ".join(["%s"] * len(queues)) + ")")
            params += queues
        sql = f"SELECT 1 FROM {self.job_table} WHERE {' AND '.join(where)} LIMIT 1"
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone() is not None

    def keyed_ready_condition(self) -> str:
        """The rows of the limited claim's ready index (jobs with a concurrency key)."""
        return f"{READY_SQL} AND {KEYED_SQL}"

    def _ready_gauge_conditions(self) -> list[str]:
        """The ready part's conditions, one part each: together they are every waiting
        and failed job, each part the predicate of one partial index."""
        return [self.ready_condition(), self.keyed_ready_condition()]

    def queue_gauges_sql(self) -> str:
        job, now = self.job_table, self.now_sql
        parts = [f"SELECT '{NOW}', '', 0, 0, {now}"]
        parts += [
            f"SELECT '{READY}', queue, COUNT(CASE WHEN next_execution_at <= {now} THEN 1 END), "
            f"COUNT(*), MIN(CASE WHEN next_execution_at <= {now} THEN next_execution_at END) "
            f"FROM {job} WHERE {condition} GROUP BY queue"
            for condition in self._ready_gauge_conditions()
        ]
        parts += [
            f"SELECT '{kind}', queue, COUNT(*), 0, {at} FROM {job} WHERE {where} GROUP BY queue"
            for kind, at, where in (
                (RUNNING, "MIN(locked_at)", RUNNING_SQL),
                (DEAD, "NULL", f"state = {sql_literal(JobState.DEAD)}"),
            )
        ]
        parts.append(
            f"SELECT '{QUEUE}', name, CASE WHEN paused THEN 1 ELSE 0 END, 0, NULL "
            f"FROM {self.queue_table}"
        )
        return " UNION ALL ".join(parts)

    def queue_gauges(self) -> tuple[datetime, list[QueueGauge]]:
        """The database's now, and the gauges of every queue that has waiting, failed,
        running or dead jobs or a row in the queue table, sorted by name. One statement."""
        with self.connection.cursor() as cursor:
            cursor.execute(self.queue_gauges_sql(), [])
            rows = cursor.fetchall()
        now: datetime | None = None
        gauges: dict[str, QueueGauge] = {}
        for kind, queue, first, second, at in rows:
            if kind == NOW:
                now = self.to_dt(at)
                continue
            gauge = gauges.get(queue)
            if gauge is None:
                gauge = gauges[queue] = QueueGauge(queue=queue)
            if kind == READY:
                gauge.ready += int(first)
                gauge.scheduled += int(second) - int(first)
                gauge.oldest_due_at = _earliest(gauge.oldest_due_at, self._dt(at))
            elif kind == RUNNING:
                gauge.running = int(first)
                gauge.oldest_running_at = self._dt(at)
            elif kind == DEAD:
                gauge.dead = int(first)
            else:
                gauge.paused = bool(first)
        if now is None:  # pragma: no cover - the first part always returns its row
            raise RuntimeError("the queue gauges statement returned no database time")
        return now, [gauges[name] for name in sorted(gauges)]

    def _dt(self, value: Any) -> datetime | None:
        return None if value is None else self.to_dt(value)


def _earliest(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
