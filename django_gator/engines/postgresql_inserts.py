"""PostgreSQL's job inserts: a single dispatch as a plain VALUES insert, a few rows as one
INSERT ... unnest() statement, many with COPY (engines/postgresql_copy.py); the NOTIFY of
dispatch rides in the statement and is delivered only on commit (with ``GATOR_NOTIFY =
False``, the wakeup datagrams of Engine.wake instead)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from operator import attrgetter
from typing import Any

from django_gator.engines.base import InsertRow
from django_gator.engines.dispatching import answered
from django_gator.engines.postgresql_copy import COPY_MIN_ROWS, INSERT_COLUMNS, PostgresCopy
from django_gator.engines.postgresql_sessions import CHANNEL
from django_gator.rows import Inserted, JobRows
from django_gator.states import SQL_WAITING

#: A single INSERT's optional columns (named only when the row has a value), each with the
#: SQL of its value.
_OPTIONAL_ONE = {
    "chain_id": "%s::uuid",
    "chain_position": "%s",
    "chain": "%s::jsonb",
    "unique_key": "%s",
    "batch_id": "%s::bigint",
    "concurrency_key": "%s",
}


class PostgresInserts(PostgresCopy):
    """The insert part of :class:`~django_gator.engines.postgresql.PostgresEngine`."""

    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        #: _insert_one()'s statements: (optional columns, scheduled, notify) -> SQL.
        self._one_sql: dict[tuple[tuple[str, ...], bool, bool], str] = {}

    def insert_jobs(
        self, rows: Sequence[InsertRow], notify: set[str] | None = None
    ) -> list[tuple[int, datetime, datetime]]:
        if notify and not self.notifies:
            # The statement without its NOTIFY, here and not through self.insert_jobs():
            # what the engine's other layers (fair queues) wrap around it runs once.
            inserted = PostgresInserts.insert_jobs(self, rows)
            self.wake(notify)  # the datagrams, once the caller's transaction commits
            return inserted
        if len(rows) == 1:
            return [self._insert_one(rows[0], notify)]
        columns = {attr: list(map(attrgetter(attr), rows)) for attr, _, _ in INSERT_COLUMNS}
        ids, now = self._insert_columns(len(rows), columns, notify)
        return [(job_id, now, row.run_at or now) for job_id, row in zip(ids, rows, strict=True)]

    def streams_rows(self, count: int) -> bool:
        return count >= COPY_MIN_ROWS

    def insert_rows(
        self,
        rows: JobRows,
        notify: set[str] | None = None,
        prepare: Callable[[int], None] | None = None,
        meanwhile: Callable[[Inserted], None] | None = None,
    ) -> Inserted:
        if notify and not self.notifies:
            inserted = PostgresInserts.insert_rows(self, rows, None, prepare, meanwhile)
            self.wake(notify)  # the datagrams, once the caller's transaction commits
            return inserted
        count = len(rows)
        if not self.streams_rows(count):
            rows.settle()
        if count == 1:
            if prepare is not None:
                prepare(1)
            return answered([self._insert_one(rows.rows()[0], notify)], meanwhile)
        answer: list[Inserted] = []

        def known(ids: list[int], now: datetime) -> None:
            answer.append(Inserted(ids, [now] * count, [rows.run_at or now] * count))
            if meanwhile is not None:
                meanwhile(answer[0])

        encode, rows.encode = rows.encode, None
        self._insert_columns(count, rows.columns(), notify, known, prepare, encode)
        return answer[0]

    def _insert_columns(
        self,
        count: int,
        columns: dict[str, Any],
        notify: set[str] | None,
        meanwhile: Callable[[list[int], datetime], None] | None = None,
        prepare: Callable[[int], None] | None = None,
        encode: Callable[[int, int], None] | None = None,
    ) -> tuple[list[int], datetime]:
        """Insert ``count`` rows given by column (InsertRow attribute: a list of one value
        per row, or the value every row shares); returns their ids in order, and the
        statement time (their created_at, and the next_execution_at of those without
        run_at). A list whose values are all the same is treated as that one value.
        ``prepare(n)`` and ``meanwhile(ids, time)``: see insert_rows(). ``encode``: the
        arguments are still to be checked and encoded (JobRows.encode; COPY only)."""
        for attr, values in columns.items():
            if isinstance(values, list) and values[0] != "" and values.count(values[0]) == count:
                columns[attr] = values[0]  # ("" is a placeholder for JSON still to encode)
        if count >= COPY_MIN_ROWS:
            return self._copy_jobs(count, columns, notify, meanwhile, prepare, encode)
        if encode is not None:
            encode(0, count)
        if prepare is not None:
            prepare(count)
        sql, params = self._unnest_insert(count, columns, notify)
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            ids, now, _ = cursor.fetchone()
        if meanwhile is not None:
            meanwhile(ids, now)
        return ids, now

    def _unnest_insert(
        self, count: int, columns: dict[str, Any], notify: set[str] | None
    ) -> tuple[str, list[Any]]:
        """One statement, whatever the number of rows: a column whose value is the same in
        every row is one parameter, the others travel as arrays through unnest(). The ids
        come back as one array, the NOTIFY rides along and, like the rows, is delivered
        only on commit."""
        select: list[str] = []
        select_params: list[Any] = []
        arrays: list[str] = []
        array_params: list[Any] = []
        unnested: list[str] = []
        for attr, sql_type, template in INSERT_COLUMNS:
            values = columns[attr]
            if isinstance(values, list):
                select.append(template.format(f"u.{attr}"))
                arrays.append(f"%s::{sql_type}[]")
                array_params.append(values)
                unnested.append(attr)
            else:
                select.append(template.format(f"%s::{sql_type}"))
                select_params.append(values)
        if arrays:
            source = f"unnest({', '.join(arrays)}) AS u({', '.join(unnested)})"
        else:
            source = "generate_series(1, %s)"
            array_params = [count]
        sql = (
            f"WITH ins AS (INSERT INTO {self.job_table} (name, args, kwargs, queue, priority, "
            "next_execution_at, chain_id, chain_position, chain, unique_key, batch_id, "
            "concurrency_key, state, attempts, rescues, created_at, last_error) "
            f"SELECT {', '.join(select)}, {SQL_WAITING}, 0, 0, "
            f"statement_timestamp(), '' FROM {source} RETURNING id) "
            "SELECT (SELECT array_agg(id ORDER BY id) FROM ins), statement_timestamp(), "
            "(SELECT count(pg_notify(%s, q)) FROM unnest(%s::text[]) AS q)"
        )
        return sql, [*select_params, *array_params, CHANNEL, sorted(notify or ())]

    def _insert_one(
        self, row: InsertRow, notify: set[str] | None
    ) -> tuple[int, datetime, datetime]:
        """A single dispatch: a plain VALUES insert plans and runs faster than unnest().
        Only the columns the row has a value for are named (state, attempts, rescues and
        last_error have database defaults; the optional columns are NULL unless set), and
        the NOTIFY rides in the RETURNING list (a CTE around the INSERT costs more to
        plan): less SQL to quote, send, parse and plan. With Django's
        ``server_side_binding`` and psycopg's ``prepare_threshold`` on (both off by
        default) psycopg prepares it, and PostgreSQL no longer plans it each time."""
        present = tuple(attr for attr in _OPTIONAL_ONE if getattr(row, attr) is not None)
        key = (present, row.run_at is not None, bool(notify))
        insert = self._one_sql.get(key)
        if insert is None:
            insert = self._one_sql[key] = self._insert_one_sql(*key)
        params: list[Any] = [row.name, row.args, row.kwargs, row.queue, row.priority]
        if row.run_at is not None:
            params.append(row.run_at)
        params += [getattr(row, attr) for attr in present]
        if notify:
            [queue] = notify
            params += [CHANNEL, queue]
        returned = self._prepared_row(insert, params)
        # Due now: next_execution_at is created_at, the same statement_timestamp().
        return returned[0], returned[1], returned[2] if row.run_at is not None else returned[1]

    def _insert_one_sql(self, present: tuple[str, ...], scheduled: bool, notify: bool) -> str:
        names = ["name", "args", "kwargs", "queue", "priority", "next_execution_at", "created_at"]
        values = ["%s", "%s::jsonb", "%s::jsonb", "%s", "%s"]
        values.append("%s::timestamptz" if scheduled else "statement_timestamp()")
        values.append("statement_timestamp()")
        names += present
        values += [_OPTIONAL_ONE[attr] for attr in present]
        returning = "id, created_at, next_execution_at" if scheduled else "id, created_at"
        if notify:
            returning += ", pg_notify(%s, %s)"
        return (
            f"INSERT INTO {self.job_table} ({', '.join(names)}) VALUES ({', '.join(values)}) "
            f"RETURNING {returning}"
        )
