"""PostgreSQL's claims and success marks: one statement each (FOR UPDATE SKIP LOCKED), the
keyset claim that reads each priority from its position, the two in one statement, and
the skip scan of the queues with ready jobs. They run on the prepared cursor
(engines/postgresql_sessions.py)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from django_gator import conf
from django_gator.attempts import Mark, batches_of
from django_gator.engines.base import JOB_COLUMNS, UNKEYED_SQL, ClaimedJob, Position
from django_gator.engines.core import BY_PICKED_IDS
from django_gator.engines.partition_moves import retrying_moves
from django_gator.engines.postgresql_sessions import PostgresSessions
from django_gator.states import (
    ACTIVE_SQL,
    READY_SQL,
    RUNNING_SQL,
    SQL_SUCCEEDED,
    claim_set_sql,
    live_sql,
)

#: The order of a claim: ordinary, and in a fair queue (docs/fairness.md).
PLAIN_ORDER = "priority DESC, next_execution_at, id"
FAIR_ORDER = "priority DESC, fair_order, id"
#: The range of the priority column (smallint): the ends of a keyset claim's gaps.
SMALLINT_MIN, SMALLINT_MAX = -32768, 32767


class PostgresClaims(PostgresSessions):
    """The claim part of :class:`~django_gator.engines.postgresql.PostgresEngine`."""

    supports_keyset = True

    def claim(
        self, worker_id: str, queue: str, limit: int, after: Position | None = None
    ) -> list[ClaimedJob]:
        if conf.partitioning() is not None:
            return retrying_moves(self, lambda: self._claim_once(worker_id, queue, limit, after))
        return self._claim_once(worker_id, queue, limit, after)

    def _claim_once(
        self, worker_id: str, queue: str, limit: int, after: Position | None
    ) -> list[ClaimedJob]:
        picked, params = self._picked(queue, limit, after)
        sql = f"WITH picked AS ({picked}) {self._claim_update_sql}"
        with self._prepared_cursor(binary=True) as cursor:
            cursor.execute(sql, [*params, worker_id])
            rows = cursor.fetchall()
        jobs = [self.claimed(row) for row in rows]
        jobs.sort(key=_dequeue_order)
        return jobs

    def claim_and_mark(
        self,
        worker_id: str,
        queue: str,
        limit: int,
        succeeded: Sequence[Mark],
        after: Position | None = None,
    ) -> tuple[list[ClaimedJob], list[int]]:
        """The success marks and the claim in one statement: one round trip and one commit
        where two statements took two. The two touch different rows (the marks running
        ones of this worker, the claim waiting ones), each with its own compare-and-set or
        lock, so one statement changes nothing of what each does. Marks of batch members
        settle their batches in the mark's transaction: those go the two-statement way."""
        if not succeeded or not limit or batches_of(succeeded):
            return super().claim_and_mark(worker_id, queue, limit, succeeded, after)
        if conf.partitioning() is not None:
            return retrying_moves(
                self, lambda: self._claim_and_mark_once(worker_id, queue, limit, succeeded, after)
            )
        return self._claim_and_mark_once(worker_id, queue, limit, succeeded, after)

    def _claim_and_mark_once(
        self,
        worker_id: str,
        queue: str,
        limit: int,
        succeeded: Sequence[Mark],
        after: Position | None,
    ) -> tuple[list[ClaimedJob], list[int]]:
        picked, params = self._picked(queue, limit, after)
        marks, marks_params = self.marks_sql(worker_id, succeeded)
        sql = (
            f"WITH marked AS ({marks}), picked AS ({picked}),"
            f" claimed AS ({self._claim_update_sql})"
            " SELECT m.ids, c.* FROM (SELECT array_agg(id) AS ids FROM marked) AS m"
            " LEFT JOIN claimed AS c ON true"
        )
        with self._prepared_cursor(binary=True) as cursor:
            cursor.execute(sql, [*marks_params, *params, worker_id])
            rows = cursor.fetchall()
        written = rows[0][0] or []
        jobs = [self.claimed(row[1:]) for row in rows if row[1] is not None]
        jobs.sort(key=_dequeue_order)
        return jobs, written

    def _picked(self, queue: str, limit: int, after: Position | None) -> tuple[str, list[Any]]:
        """The SELECT of the ids a claim takes, and its parameters. A fair queue's claim
        reads its own index by (priority, stamp, id), from the start (no keyset: a stamp
        given after a position may sort before it)."""
        fair = queue in conf.fairness()
        if after is not None and not fair:
            return self._keyset_picked(queue, limit, after)
        picked = (
            f"SELECT id FROM {self.job_table}"
            f" WHERE queue = %s AND {READY_SQL} AND {UNKEYED_SQL}"
            f" AND next_execution_at <= {self.now_sql} AND {live_sql(self.now_sql)}"
            f" AND {self.not_paused_sql}"
            f" ORDER BY {FAIR_ORDER if fair else PLAIN_ORDER}"
            " LIMIT %s FOR UPDATE SKIP LOCKED"
        )
        if fair:
            picked = picked.replace(" ORDER BY", " AND fair_order IS NOT NULL ORDER BY")
        return picked, [queue, queue, limit]

    @property
    def _claim_update_sql(self) -> str:
        if conf.partitioning() is not None:
            return self._claim_update_partitioned
        return self._claim_update

    @cached_property
    def _claim_update_partitioned(self) -> str:
        """The UPDATE of a claim on partitioned storage: the active states named, so that
        the planner joins the active partition only (the picked rows are locked: still
        ready)."""
        return self._claim_update.replace(
            " FROM picked WHERE j.id = picked.id",
            f" FROM picked WHERE j.id = picked.id AND j.{ACTIVE_SQL}",
        )

    @cached_property
    def _claim_update(self) -> str:
        """The UPDATE of a claim, of the rows of a ``picked`` CTE; one parameter, the
        worker id."""
        return (
            f"UPDATE {self.job_table} AS j SET {claim_set_sql(self.now_sql, 'j.')}"
            f" FROM picked WHERE j.id = picked.id AND {BY_PICKED_IDS}"
            " RETURNING " + ", ".join(f"j.{c.strip()}" for c in JOB_COLUMNS.split(","))
        )

    def _keyset_picked(self, queue: str, limit: int, after: Position) -> tuple[str, list[Any]]:
        """The ids a keyset claim takes: one index range scan per priority of ``after``,
        each starting at its position (or ``lookback`` seconds before now, if that is
        earlier), and one per gap between those priorities, from the gap's start. Every
        scan is an index descent plus the rows it reads; none steps over the entries
        before a position, however many a long transaction keeps there."""
        known = sorted(after.after, reverse=True)
        gaps: list[tuple[int, int]] = []
        high = SMALLINT_MAX
        for priority in known:
            if priority < high:
                gaps.append((priority + 1, high))
            high = priority - 1
        if high >= SMALLINT_MIN:
            gaps.append((SMALLINT_MIN, high))
        columns = "id, priority, next_execution_at"
        ready = (
            f"queue = %s AND {READY_SQL} AND {UNKEYED_SQL} AND next_execution_at <= {self.now_sql}"
            f" AND {live_sql(self.now_sql)}"
        )
        lock = "LIMIT %s FOR UPDATE SKIP LOCKED"
        parts = []
        params: list[Any] = []
        if known:
            # The start of each priority's scan: its position, unless that is less than
            # ``lookback`` before now; then now - lookback (any id).
            parts.append(
                f"SELECT s.* FROM (SELECT k.p, CASE WHEN k.t < b.since THEN k.t ELSE b.since "
                "END AS t, CASE WHEN k.t < b.since THEN k.i ELSE 0 END AS i "
                "FROM unnest(%s::smallint[], %s::timestamptz[], %s::bigint[]) AS k(p, t, i), "
                f"(SELECT {self.now_sql} - %s::float8 * interval '1 second' AS since) AS b) AS c"
                f" CROSS JOIN LATERAL (SELECT {columns} FROM {self.job_table} WHERE {ready}"
                " AND priority = c.p AND (next_execution_at, id) > (c.t, c.i)"
                f" ORDER BY next_execution_at, id {lock}) AS s"
            )
            params += [
                known,
                [after.after[p][0] for p in known],
                [after.after[p][1] for p in known],
                after.lookback,
                queue,
                limit,
            ]
        if gaps:
            parts.append(
                "SELECT s.* FROM unnest(%s::smallint[], %s::smallint[]) AS g(lo, hi)"
                f" CROSS JOIN LATERAL (SELECT {columns} FROM {self.job_table} WHERE {ready}"
                " AND priority >= g.lo AND priority <= g.hi"
                f" ORDER BY priority DESC, next_execution_at, id {lock}) AS s"
            )
            params += [[g[0] for g in gaps], [g[1] for g in gaps], queue, limit]
        # The pause check once for the whole claim: a one-time filter above the scans,
        # which then do not run at all when the queue is paused.
        picked = (
            f"SELECT id FROM ({' UNION ALL '.join(parts)}) AS x WHERE {self.not_paused_sql}"
            " ORDER BY priority DESC, next_execution_at, id LIMIT %s"
        )
        return picked, [*params, queue, limit]

    def ready_queues(self, known: Sequence[str] = ()) -> list[str]:
        if not known:
            return super().ready_queues()
        # A skip scan that jumps over the known queues: from each position (a queue found,
        # or a known queue), the next queue with a ready entry before the next known name;
        # if there is none, on to that known name.
        first = (
            f"SELECT queue FROM {self.job_table} WHERE {self.ready_condition()}"
            " AND queue > q.queue{}"
            " ORDER BY queue LIMIT 1"
        )
        sql = (
            "WITH RECURSIVE q(queue, hit) AS ("
            " SELECT ''::varchar, false"
            " UNION ALL"
            " SELECT COALESCE(n.found, n.known), n.found IS NOT NULL FROM q, LATERAL ("
            "  SELECT nk.known, CASE WHEN nk.known IS NULL"
            f"   THEN ({first.format('')})"
            f"   ELSE ({first.format(' AND queue < nk.known')}) END AS found"
            "  FROM (SELECT min(k) AS known FROM unnest(%s::varchar[]) AS k"
            "   WHERE k > q.queue) AS nk) AS n"
            " WHERE COALESCE(n.found, n.known) IS NOT NULL"
            f") SELECT queue FROM q WHERE hit AND {self.unpaused_sql('q.queue')}"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [list(known)])
            return [row[0] for row in cursor.fetchall()]

    def mark_succeeded(self, worker_id: str, done: Sequence[Mark]) -> list[int]:
        if conf.partitioning() is not None and not self.connection.in_atomic_block:
            return retrying_moves(self, lambda: self._mark_succeeded_once(worker_id, done))
        return self._mark_succeeded_once(worker_id, done)

    def _mark_succeeded_once(self, worker_id: str, done: Sequence[Mark]) -> list[int]:
        if len(done) == 1:
            return super().mark_succeeded(worker_id, done)
        sql, params = self.marks_sql(worker_id, done)
        batches = batches_of(done)
        with self.write_transaction() if batches else self._prepared_cursor() as cursor:
            cursor.execute(sql, params)
            written = [row[0] for row in cursor.fetchall()]
            self._settle_batches(cursor, batches)
            return written

    def marks_sql(self, worker_id: str, done: Sequence[Mark]) -> tuple[str, list[Any]]:
        """One UPDATE of success marks, each row found by its
        primary key (see guard()) and matched on its claim; returns the ids written. The
        batches of batch members are not settled here (see mark_succeeded).

        The ids are named twice: joined to the unnested values, and as ``j.id = ANY(...)``,
        which is a condition the primary key's index takes. Prepared, this statement runs
        on the plan made at the session's first mark, with the table's size then; joined
        alone, that plan could read the whole table (or its whole primary key, with
        sequential scans off) into a hash join, as it did under a long transaction: 17,149
        buffers a mark (docs/benchmarks.md)."""
        ids = [d.id for d in done]
        sql = (
            f"UPDATE {self.job_table} AS j SET state = {SQL_SUCCEEDED}, "
            f"finished_at = {self.now_sql}, result = u.r::jsonb "
            "FROM unnest(%s::bigint[], %s::int[], %s::text[]) AS u(id, attempts, r) "
            "WHERE j.id = ANY(%s::bigint[]) AND j.id = u.id AND "
            f"{self._running_first}CASE WHEN j.attempts = u.attempts "
            f"AND j.{RUNNING_SQL} "
            "AND j.reserved_by = %s THEN true END RETURNING j.id"
        )
        params: list[Any] = [
            ids,
            [d.attempts for d in done],
            [d.result for d in done],
            ids,
            worker_id,
        ]
        return sql, params

    @property
    def _running_first(self) -> str:
        """Partitioned storage: the active states outside the marks' CASE, for the planner
        to look in the active partition only (see PostgresEngine._guard)."""
        return f"j.{ACTIVE_SQL} AND " if conf.partitioning() is not None else ""


def _dequeue_order(job: ClaimedJob) -> tuple[int, int]:
    return (-job.priority, job.id)
