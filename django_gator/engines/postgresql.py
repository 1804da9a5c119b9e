"""PostgreSQL: one-statement claims with FOR UPDATE SKIP LOCKED, unnest() bulk inserts,
and NOTIFY on dispatch (delivered by PostgreSQL only when the transaction commits)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from functools import cached_property
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import psycopg
from django.db import transaction

from django_gator import conf
from django_gator.attempts import Mark, batches_of
from django_gator.engines.base import (
    JOB_COLUMNS,
    UNKEYED_SQL,
    ClaimedJob,
    Engine,
    InsertRow,
    Listener,
    Position,
)
from django_gator.engines.dispatching import answered
from django_gator.rows import Inserted, JobRows
from django_gator.states import READY_SQL, RUNNING_SQL, SQL_SUCCEEDED, SQL_WAITING, claim_set_sql

if TYPE_CHECKING:
    from django_gator.worker.connections import NetworkBounds

#: dispatch_many of at least this many rows uses COPY (below it, one INSERT ... unnest()
#: statement, which costs less than COPY's extra round trips).
COPY_MIN_ROWS = 1000
#: Rows per write() of the COPY data.
COPY_CHUNK = 5000
#: InsertRow attributes left out of a COPY when they are NULL in every row.
_COPY_OPTIONAL = frozenset({"chain_id", "chain_position", "chain", "unique_key"})
#: Columns named differently from their InsertRow attribute.
_COPY_NAMES = {"run_at": "next_execution_at"}
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
#: InsertRow attributes that hold JSON text and are never NULL.
_JSON = frozenset({"args", "kwargs"})
#: ``count`` ids from the jobs table's sequence, and the statement's time. The sequence is
#: looked up once (MATERIALIZED), not once per id: that took 0.3 s of a 100,000-row COPY.
_RESERVE_IDS = (
    "WITH s AS MATERIALIZED (SELECT pg_get_serial_sequence(%s, 'id')::regclass AS seq) "
    "SELECT array(SELECT nextval(s.seq) FROM s, generate_series(1, %s)), "
    "statement_timestamp()"
)
#: The LISTEN/NOTIFY channel; the payload is the queue name.
CHANNEL = "django_gator"
#: The range of the priority column (smallint): the ends of a keyset claim's gaps.
SMALLINT_MIN, SMALLINT_MAX = -32768, 32767


class PostgresListener(Listener):
    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def wait(self, timeout: float) -> set[str]:
        queues = set()
        for notify in self.connection.notifies(timeout=timeout, stop_after=1):
            queues.add(notify.payload)
        # Drain whatever else arrived meanwhile without waiting.
        for notify in self.connection.notifies(timeout=0):
            queues.add(notify.payload)
        return queues


class PostgresEngine(Engine):
    vendor = "postgresql"
    can_listen = True
    _json_param = "%s::jsonb"
    now_sql = "statement_timestamp()"
    later_sql = "statement_timestamp() + %s::float8 * interval '1 second'"

    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        #: _insert_one()'s statements: (optional columns, scheduled, notify) -> SQL.
        self._one_sql: dict[tuple[tuple[str, ...], bool, bool], str] = {}

    #: (InsertRow attribute, SQL type of the parameter, SQL of the value in the SELECT list)
    _INSERT_COLUMNS = (
        ("name", "text", "{}"),
        ("args", "text", "{}::jsonb"),
        ("kwargs", "text", "{}::jsonb"),
        ("queue", "text", "{}"),
        ("priority", "smallint", "{}"),
        ("run_at", "timestamptz", "COALESCE({}, statement_timestamp())"),
        ("chain_id", "uuid", "{}"),
        ("chain_position", "smallint", "{}"),
        ("chain", "text", "{}::jsonb"),
        ("unique_key", "text", "{}"),
        ("batch_id", "bigint", "{}"),
        ("concurrency_key", "text", "{}"),
    )

    def insert_jobs(
        self, rows: Sequence[InsertRow], notify: set[str] | None = None
    ) -> list[tuple[int, datetime, datetime]]:
        if len(rows) == 1:
            return [self._insert_one(rows[0], notify)]
        columns = {attr: list(map(attrgetter(attr), rows)) for attr, _, _ in self._INSERT_COLUMNS}
        ids, now = self._insert_columns(len(rows), columns, notify)
        return [(job_id, now, row.run_at or now) for job_id, row in zip(ids, rows, strict=True)]

    def streams_rows(self, count: int) -> bool:
        return count >= COPY_MIN_ROWS

    def insert_rows(
        self,
        rows: JobRows,
        notify: set[str] | None = None,
        prepare: Callable[[], None] | None = None,
        meanwhile: Callable[[Inserted], None] | None = None,
    ) -> Inserted:
        count = len(rows)
        if not self.streams_rows(count):
            rows.settle()
        if count == 1:
            if prepare is not None:
                prepare()
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
        prepare: Callable[[], None] | None = None,
        encode: Callable[[int, int], None] | None = None,
    ) -> tuple[list[int], datetime]:
        """Insert ``count`` rows given by column (InsertRow attribute: a list of one value
        per row, or the value every row shares); returns their ids in order, and the
        statement time (their created_at, and the next_execution_at of those without
        run_at). A list whose values are all the same is treated as that one value.
        ``prepare()`` and ``meanwhile(ids, time)``: see insert_rows(). ``encode``: the
        arguments are still to be checked and encoded (JobRows.encode; COPY only)."""
        for attr, values in columns.items():
            if isinstance(values, list) and values[0] != "" and values.count(values[0]) == count:
                columns[attr] = values[0]  # ("" is a placeholder for JSON still to encode)
        if count >= COPY_MIN_ROWS:
            return self._copy_jobs(count, columns, notify, meanwhile, prepare, encode)
        if encode is not None:
            encode(0, count)
        if prepare is not None:
            prepare()
        # One statement, whatever the number of rows: a column whose value is the same in
        # every row is one parameter, the others travel as arrays through unnest(). The ids
        # come back as one array, the NOTIFY rides along and, like the rows, is delivered
        # only on commit.
        select: list[str] = []
        select_params: list[Any] = []
        arrays: list[str] = []
        array_params: list[Any] = []
        unnested: list[str] = []
        for attr, sql_type, template in self._INSERT_COLUMNS:
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
        params = [*select_params, *array_params, CHANNEL, sorted(notify or ())]
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            ids, now, _ = cursor.fetchone()
        if meanwhile is not None:
            meanwhile(ids, now)
        return ids, now

    def _copy_jobs(
        self,
        count: int,
        columns: dict[str, Any],
        notify: set[str] | None,
        meanwhile: Callable[[list[int], datetime], None] | None,
        prepare: Callable[[], None] | None,
        encode: Callable[[int, int], None] | None = None,
    ) -> tuple[list[int], datetime]:
        """A large dispatch_many: ids reserved from the sequence in one statement, the rows
        sent with COPY (no parameters, no plan), the NOTIFY after them; all in one
        transaction (a savepoint inside the caller's), so that, like the INSERT, it is all
        or nothing and the NOTIFY is delivered only on commit.

        ``encode(start, stop)``, when given, checks and encodes the arguments of each chunk
        just before it is built, so the client's checks overlap PostgreSQL's parsing of the
        chunks already sent; a bad item raises there, which ends the COPY with an error
        (psycopg sends CopyFail) and rolls the savepoint back: nothing is inserted.

        What every row shares is formatted once, into the end of each line; columns NULL in
        every row (chains, unique keys) and those whose database default is the value
        (state, attempts, rescues, last_error) are left out. The lines are built and sent
        COPY_CHUNK rows at a time, so PostgreSQL reads one chunk while the next is built;
        ``prepare`` runs while the ids are drawn, ``meanwhile`` after the last line is
        sent, before the COPY's end."""
        with transaction.atomic(using=self.alias), self.connection.cursor() as cursor:
            # Pipelined: prepare() runs while PostgreSQL draws the ids (the query is sent,
            # its answer read after), which takes it longer than anything else but the COPY.
            with self.connection.wrap_database_errors, self.connection.connection.pipeline():
                cursor.execute(_RESERVE_IDS, [self.job_table, count])
                if prepare is not None:
                    prepare()
                ids, now = cursor.fetchone()
            ids.sort()
            now_text = now.isoformat()
            names = ["id"]
            varying: list[tuple[list[Any], Callable[[list[Any]], list[str]]]] = [(ids, _copy_ints)]
            shared = [now_text]
            shared_names = ["created_at"]
            for attr, _, _ in self._INSERT_COLUMNS:
                values = columns[attr]
                name = _COPY_NAMES.get(attr, attr)
                # run_at None: due now (the statement's time, as the INSERT's COALESCE)
                null = now_text if attr == "run_at" else "\\N"
                if isinstance(values, list):
                    names.append(name)
                    varying.append((values, _copy_json if attr in _JSON else _texts(null)))
                elif values is not None or attr not in _COPY_OPTIONAL:
                    shared_names.append(name)
                    shared.append(_copy_text(values, null))
            end = "\t" + "\t".join(shared) + "\n"
            raw = cursor.cursor  # psycopg's own cursor: Django's wrapper has no copy()
            statement = f"COPY {self.job_table} ({', '.join(names + shared_names)}) FROM STDIN"
            # The driver's errors as Django's (DataError, ...), as from cursor.execute().
            with self.connection.wrap_database_errors, raw.copy(statement) as copy:
                for start in range(0, count, COPY_CHUNK):
                    stop = start + COPY_CHUNK
                    if encode is not None:
                        encode(start, min(stop, count))
                    texts = [convert(values[start:stop]) for values, convert in varying]
                    lines = map("\t".join, zip(*texts, strict=True)) if len(texts) > 1 else texts[0]
                    copy.write(end.join(lines) + end)
                if meanwhile is not None:  # while PostgreSQL reads what the socket holds
                    meanwhile(ids, now)
            if notify:
                cursor.execute(
                    "SELECT count(pg_notify(%s, q)) FROM unnest(%s::text[]) AS q",
                    [CHANNEL, sorted(notify)],
                )
        return ids, now

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
        with self.connection.cursor() as cursor:
            cursor.execute(insert, params)
            returned = cursor.fetchone()
        return returned[0], returned[1], returned[2]

    def _insert_one_sql(self, present: tuple[str, ...], scheduled: bool, notify: bool) -> str:
        names = ["name", "args", "kwargs", "queue", "priority", "next_execution_at", "created_at"]
        values = ["%s", "%s::jsonb", "%s::jsonb", "%s", "%s"]
        values.append("%s::timestamptz" if scheduled else "statement_timestamp()")
        values.append("statement_timestamp()")
        names += present
        values += [_OPTIONAL_ONE[attr] for attr in present]
        returning = "id, created_at, next_execution_at"
        if notify:
            returning += ", pg_notify(%s, %s)"
        return (
            f"INSERT INTO {self.job_table} ({', '.join(names)}) VALUES ({', '.join(values)}) "
            f"RETURNING {returning}"
        )

    def is_deadlock(self, exc: BaseException) -> bool:
        """PostgreSQL's deadlock detector ended the transaction (SQLSTATE 40P01); Django
        wraps psycopg's error, which it keeps as the cause."""
        return isinstance(exc, psycopg.errors.DeadlockDetected) or isinstance(
            exc.__cause__, psycopg.errors.DeadlockDetected
        )

    def wake(self, queues: Collection[str]) -> None:
        """A NOTIFY per queue, as dispatch sends: listening workers claim at once (delivered
        when the caller's transaction commits, if there is one)."""
        with self.connection.cursor() as cursor:
            for queue in sorted(queues):
                cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, queue])

    @contextmanager
    def listen(self) -> Iterator[Listener]:
        """A connection of its own (not Django's), in autocommit, listening on CHANNEL.
        Behind a transaction pooler, use the engine of a direct alias instead
        (``GATOR_LISTEN_DATABASE``; worker/pooling.py)."""
        django_connection = self.connection
        params = django_connection.get_connection_params()
        raw = django_connection.get_new_connection(params)
        try:
            raw.autocommit = True
            self._opened_own_connection(raw)  # a worker process bounds it as its others
            raw.execute(f"LISTEN {CHANNEL}")
            yield PostgresListener(raw)
        finally:
            raw.close()

    def prepare_bookkeeping(self) -> None:
        """The session of the fetcher's and heartbeat's connections (never the executors',
        which run user code), set once per connection:

        - ``synchronous_commit = off``: a claim or an outcome mark then costs no WAL
          flush. A PostgreSQL crash (not a clean restart) can undo the last moments of such
          writes; the affected jobs simply run again, and a dispatch, which commits in the
          caller's transaction, is never affected. GATOR_ASYNC_COMMIT = False leaves it on.
        - ``plan_cache_mode = force_generic_plan``: the claim and success-mark statements
          are prepared once per session (see _prepared_cursor) and their plan does not
          depend on the values bound (the same index scans whatever the queue, the batch or
          the keyset position). Left to choose, PostgreSQL kept planning them anew at each
          run (a custom plan: its estimate for the generic one, with a LIMIT it cannot
          see, is higher), which took 0.35-0.7 ms of a claim whose execution takes 0.06-0.25
          ms. The statements this connection sends without parameters are not affected.

        Behind a transaction pooler (``pooled``) a SET would stick to whichever server
        session ran it, so nothing is set there (docs/deployment.md: set
        synchronous_commit on the role), and nothing is prepared."""
        connection = self.connection
        connection.ensure_connection()
        raw = connection.connection
        if getattr(raw, "_gator_bookkeeping", False):
            return
        if self.pooled:
            raw.prepare_threshold = None  # see prepare_worker_session()
            raw._gator_bookkeeping = True
            return
        sql = "SET plan_cache_mode TO force_generic_plan"
        if conf.async_commit():
            sql += "; SET synchronous_commit TO off"
        with connection.cursor() as cursor:
            cursor.execute(sql, [])
        raw._gator_bookkeeping = True

    def prepare_worker_session(self, raw: Any, bounds: NetworkBounds) -> None:
        """Keepalive probes and TCP_USER_TIMEOUT on the server's socket, set for this
        session only: the backend of a worker gone silent ends, rolling back its
        transaction, after about ``bounds.seconds`` (the defaults are the OS's: a first
        probe after two hours, and unacknowledged data retransmitted for 15 minutes). And
        client_connection_check_interval, so that a statement still running when the
        worker went silent is cancelled too: otherwise PostgreSQL looks at the socket only
        between statements. No idle_in_transaction_session_timeout: it would also end a
        live worker's transaction left idle by a long job, which keepalives never do.

        Behind a transaction pooler (``pooled``) the server's session belongs to the pooler
        and is shared: nothing is set there (the client's socket, to the pooler, is still
        bounded), and psycopg never prepares a statement on the server (the next
        transaction may run on a session that does not have it)."""
        if self.pooled:
            raw.prepare_threshold = None
            return
        settings = {
            "tcp_keepalives_idle": bounds.keepalive_idle,
            "tcp_keepalives_interval": bounds.keepalive_interval,
            "tcp_keepalives_count": bounds.keepalive_count,
            "tcp_user_timeout": bounds.user_timeout_ms,
            "client_connection_check_interval": bounds.keepalive_interval * 1000,
        }
        sql = "SELECT " + ", ".join(["set_config(%s, %s, false)"] * len(settings))
        params = [item for name, value in settings.items() for item in (name, str(value))]
        with raw.cursor() as cursor:
            cursor.execute(sql, params)

    def _guard(self, condition: str) -> str:
        # Inside a CASE the conditions can neither drive an index scan nor prove a partial
        # index's predicate, so the planner has only the primary key to find the row by.
        return f"CASE WHEN {condition} AND {RUNNING_SQL} AND reserved_by = %s THEN true END"

    supports_keyset = True

    @contextmanager
    def _prepared_cursor(self) -> Iterator[Any]:
        """A cursor for the worker's hot statements (the claim, the batched success mark):
        it binds the parameters on the server and has the statement prepared on its first
        run, so PostgreSQL parses and plans each of them once per connection instead of on
        every claim (Django's cursors bind on the client and never prepare). Django's cursor
        wrapper goes around it, so execute wrappers and error translation apply as to any
        cursor. After five runs PostgreSQL may keep one generic plan for any parameters,
        when its estimated cost is no higher than that of the plans made for the values at
        hand (``plan_cache_mode = auto``); tests/engines/test_contract_plans.py checks those plans.

        The ordinary cursor instead: behind a transaction pooler (``pooled``: nothing may
        stay in a server session), and while queries are logged (DEBUG, or a test capturing
        them), as Django reads the text of a logged query from the client-side binding."""
        connection = self.connection
        if self.pooled or connection.queries_logged:
            with connection.cursor() as cursor:
                yield cursor
            return
        connection.close_if_health_check_failed()
        connection.ensure_connection()
        connection.validate_thread_sharing()
        with connection.wrap_database_errors:
            raw = _PreparedCursor(connection.connection)
        with connection.make_cursor(raw) as cursor:
            yield cursor

    def claim(
        self, worker_id: str, queue: str, limit: int, after: Position | None = None
    ) -> list[ClaimedJob]:
        picked, params = self._picked(queue, limit, after)
        sql = f"WITH picked AS ({picked}) {self._claim_update}"
        with self._prepared_cursor() as cursor:
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
        picked, params = self._picked(queue, limit, after)
        marks, marks_params = self.marks_sql(worker_id, succeeded)
        sql = (
            f"WITH marked AS ({marks}), picked AS ({picked}),"
            f" claimed AS ({self._claim_update})"
            " SELECT m.ids, c.* FROM (SELECT array_agg(id) AS ids FROM marked) AS m"
            " LEFT JOIN claimed AS c ON true"
        )
        with self._prepared_cursor() as cursor:
            cursor.execute(sql, [*marks_params, *params, worker_id])
            rows = cursor.fetchall()
        written = rows[0][0] or []
        jobs = [self.claimed(row[1:]) for row in rows if row[1] is not None]
        jobs.sort(key=_dequeue_order)
        return jobs, written

    def _picked(self, queue: str, limit: int, after: Position | None) -> tuple[str, list[Any]]:
        """The SELECT of the ids a claim takes, and its parameters."""
        if after is not None:
            return self._keyset_picked(queue, limit, after)
        picked = (
            f"SELECT id FROM {self.job_table}"
            f" WHERE queue = %s AND {READY_SQL} AND {UNKEYED_SQL}"
            f" AND next_execution_at <= {self.now_sql}"
            f" AND {self.not_paused_sql}"
            " ORDER BY priority DESC, next_execution_at, id"
            " LIMIT %s FOR UPDATE SKIP LOCKED"
        )
        return picked, [queue, queue, limit]

    @cached_property
    def _claim_update(self) -> str:
        """The UPDATE of a claim, of the rows of a ``picked`` CTE; one parameter, the
        worker id."""
        return (
            f"UPDATE {self.job_table} AS j SET {claim_set_sql(self.now_sql, 'j.')}"
            " FROM picked WHERE j.id = picked.id"
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
        primary key (see _guard()) and matched on its claim; returns the ids written. The
        batches of batch members are not settled here (see mark_succeeded)."""
        sql = (
            f"UPDATE {self.job_table} AS j SET state = {SQL_SUCCEEDED}, "
            f"finished_at = {self.now_sql}, result = u.r::jsonb "
            "FROM unnest(%s::bigint[], %s::int[], %s::text[]) AS u(id, attempts, r) "
            f"WHERE j.id = u.id AND CASE WHEN j.attempts = u.attempts AND j.{RUNNING_SQL} "
            "AND j.reserved_by = %s THEN true END RETURNING j.id"
        )
        params: list[Any] = [
            [d.id for d in done],
            [d.attempts for d in done],
            [d.result for d in done],
            worker_id,
        ]
        return sql, params


def _copy_ints(values: list[int]) -> list[str]:
    return list(map(str, values))


def _copy_json(values: list[str]) -> list[str]:
    """JSON text as COPY's text format wants it: JSON has no raw tab, newline or carriage
    return (the encoder escapes control characters), so only backslashes are doubled."""
    return [value.replace("\\", "\\\\") for value in values]


def _texts(null: str) -> Callable[[list[Any]], list[str]]:
    """A converter of values to COPY text, None written as ``null``."""
    return lambda values: [_copy_text(value, null) for value in values]


class _PreparedCursor(psycopg.Cursor[Any]):
    """psycopg's server-binding cursor, preparing every statement it runs (see
    PostgresEngine._prepared_cursor). Django opens its connections with psycopg's prepared
    statements off (``prepare_threshold`` None, which makes psycopg ignore even the
    statements it has prepared), so the threshold is lifted for this cursor's statements
    only: the connection's other cursors are left as configured."""

    def execute(
        self, query: Any, params: Any = None, *, prepare: bool | None = None, **kwargs: Any
    ) -> _PreparedCursor:
        connection = self.connection
        threshold = connection.prepare_threshold
        if threshold is None:
            connection.prepare_threshold = 0
        try:
            super().execute(query, params, prepare=True if prepare is None else prepare, **kwargs)
        finally:
            if threshold is None:
                connection.prepare_threshold = None
        return self


def _copy_text(value: Any, null: str) -> str:
    """A value as COPY's text format writes it; None as ``null``."""
    if value is None:
        return null
    if isinstance(value, str):
        if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
            value = (
                value.replace("\\", "\\\\")
                .replace("\t", "\\t")
                .replace("\n", "\\n")
                .replace("\r", "\\r")
            )
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _dequeue_order(job: ClaimedJob) -> tuple[int, int]:
    return (-job.priority, job.id)
