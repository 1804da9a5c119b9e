"""PostgreSQL: one-statement claims with FOR UPDATE SKIP LOCKED, unnest() bulk inserts,
and NOTIFY on dispatch (delivered by PostgreSQL only when the transaction commits)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django_gator.engines.base import JOB_COLUMNS, READY_SQL, ClaimedJob, Engine, InsertRow

#: The LISTEN/NOTIFY channel; the payload is the queue name.
CHANNEL = "django_gator"


class PostgresEngine(Engine):
    vendor = "postgresql"
    now_sql = "statement_timestamp()"

    def json_append_sql(self, column: str) -> str:
        return f"COALESCE({column}, '[]'::jsonb) || jsonb_build_array(%s::jsonb)"

    def insert_jobs(
        self, rows: Sequence[InsertRow], notify: set[str] | None = None
    ) -> list[tuple[int, datetime, datetime]]:
        # Every column travels as one array: any number of rows is one statement with a
        # fixed number of parameters (no 65535-parameter limit, one parse). The NOTIFY rides
        # in the same statement and, like the rows, is only delivered on commit.
        sql = (
            f"WITH ins AS (INSERT INTO {self.job_table} (name, args, kwargs, queue, priority, "
            "state, attempts, rescues, next_execution_at, created_at, last_error, chain_id, "
            "chain_position, chain) "
            "SELECT u.name, u.a::jsonb, u.k::jsonb, u.queue, u.priority, 'waiting', 0, 0, "
            f"COALESCE(u.run_at, {self.now_sql}), {self.now_sql}, '', u.chain_id, "
            "u.chain_position, u.chain::jsonb "
            "FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::smallint[], "
            "%s::timestamptz[], %s::uuid[], %s::smallint[], %s::text[]) "
            "AS u(name, a, k, queue, priority, run_at, chain_id, chain_position, chain) "
            "RETURNING id, created_at, next_execution_at) "
            "SELECT ins.id, ins.created_at, ins.next_execution_at FROM ins, "
            "(SELECT count(pg_notify(%s, q)) FROM unnest(%s::text[]) AS q) AS n"
        )
        params: list[Any] = [
            [r.name for r in rows],
            [r.args for r in rows],
            [r.kwargs for r in rows],
            [r.queue for r in rows],
            [r.priority for r in rows],
            [r.run_at for r in rows],
            [r.chain_id for r in rows],
            [r.chain_position for r in rows],
            [r.chain for r in rows],
            CHANNEL,
            sorted(notify or ()),
        ]
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            returned = sorted(cursor.fetchall())
        return [(r[0], r[1], r[2]) for r in returned]

    def claim(self, worker_id: str, queue: str, limit: int) -> list[ClaimedJob]:
        sql = (
            "WITH picked AS ("
            f" SELECT id FROM {self.job_table}"
            f" WHERE queue = %s AND {READY_SQL} AND next_execution_at <= {self.now_sql}"
            " ORDER BY priority DESC, next_execution_at, id"
            " LIMIT %s FOR UPDATE SKIP LOCKED"
            f") UPDATE {self.job_table} AS j SET state = 'running', attempts = j.attempts + 1,"
            f" reserved_by = %s, locked_at = {self.now_sql},"
            f" started_at = COALESCE(j.started_at, {self.now_sql})"
            " FROM picked WHERE j.id = picked.id"
            " RETURNING " + ", ".join(f"j.{c.strip()}" for c in JOB_COLUMNS.split(","))
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [queue, limit, worker_id])
            rows = cursor.fetchall()
        jobs = [self.claimed(row) for row in rows]
        jobs.sort(key=_dequeue_order)
        return jobs

    def mark_succeeded(
        self, worker_id: str, done: Sequence[tuple[int, int, str | None]]
    ) -> list[int]:
        if len(done) == 1:
            return super().mark_succeeded(worker_id, done)
        sql = (
            f"UPDATE {self.job_table} AS j SET state = 'succeeded', "
            f"finished_at = {self.now_sql}, result = u.r::jsonb "
            "FROM unnest(%s::bigint[], %s::int[], %s::text[]) AS u(id, attempts, r) "
            "WHERE j.id = u.id AND j.attempts = u.attempts AND j.state = 'running' "
            "AND j.reserved_by = %s RETURNING j.id"
        )
        params: list[Any] = [
            [d[0] for d in done],
            [d[1] for d in done],
            [d[2] for d in done],
            worker_id,
        ]
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return [row[0] for row in cursor.fetchall()]


def _dequeue_order(job: ClaimedJob) -> tuple[int, int]:
    return (-job.priority, job.id)
