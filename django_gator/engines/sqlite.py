"""SQLite: one writer at a time. The claim is a single UPDATE ... RETURNING statement, which
takes SQLite's write lock before it reads, so two workers can never take the same row;
multi-statement writes run in BEGIN IMMEDIATE transactions."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django_gator.engines.base import JOB_COLUMNS, READY_SQL, ClaimedJob, Engine, Keyset


class SQLiteEngine(Engine):
    vendor = "sqlite"
    # The format Django stores (UTC, no zone); '%%' because Django's cursor uses %s params.
    now_sql = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
    # NULL || '...' is NULL, and strftime() of a NULL modifier is NULL.
    later_sql = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s || ' seconds')"

    def json_append_sql(self, column: str) -> str:
        return f"json_insert(COALESCE({column}, '[]'), '$[#]', json(%s))"

    mark_in_claim_transaction = True

    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        # Compare-and-set writes look rows up by rowid only: without the hint, a batch of
        # ids is planned on an index of states, whose running entries grow with every job.
        self.cas_table_sql = f"{self.job_table} NOT INDEXED"

    @contextmanager
    def write_transaction(self) -> Iterator[Any]:
        # Take the write lock up front: a deferred transaction that reads and then writes
        # fails with SQLITE_BUSY when another connection wrote in between.
        with self.raw_transaction("BEGIN IMMEDIATE") as cursor:
            yield cursor

    def insert_sql(self) -> str:
        def col(index: int) -> str:
            return f"json_extract(value, '$[{index}]')"

        return (
            f"INSERT INTO {self.job_table} (name, args, kwargs, queue, priority, state, "
            "attempts, rescues, next_execution_at, created_at, last_error, chain_id, "
            f"chain_position, chain, unique_key) SELECT {col(0)}, {col(1)}, {col(2)}, {col(3)}, "
            f"{col(4)}, 'waiting', 0, 0, COALESCE({col(5)}, {self.now_sql}), {self.now_sql}, '', "
            f"{col(6)}, {col(7)}, {col(8)}, {col(9)} FROM json_each(%s) ORDER BY key "
            "RETURNING id, created_at, next_execution_at"
        )

    def claim(
        self, worker_id: str, queue: str, limit: int, after: Keyset | None = None
    ) -> list[ClaimedJob]:
        with self.connection.cursor() as cursor:
            return self._claim(cursor, worker_id, queue, limit)

    def _claim(self, cursor: Any, worker_id: str, queue: str, limit: int) -> list[ClaimedJob]:
        sql = (
            f"UPDATE {self.job_table} SET state = 'running', attempts = attempts + 1,"
            f" reserved_by = %s, locked_at = {self.now_sql}, isolated = FALSE,"
            f" started_at = COALESCE(started_at, {self.now_sql})"
            f" WHERE id IN (SELECT id FROM {self.job_table}"
            f"  WHERE queue = %s AND {READY_SQL} AND next_execution_at <= {self.now_sql}"
            "  ORDER BY priority DESC, next_execution_at, id LIMIT %s)"
            f" RETURNING {JOB_COLUMNS}"
        )
        cursor.execute(sql, [worker_id, queue, limit])
        jobs = [self.claimed(row) for row in cursor.fetchall()]
        jobs.sort(key=lambda j: (-j.priority, j.id))
        return jobs
