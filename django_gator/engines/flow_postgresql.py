"""PostgreSQL: the limited claim in one round trip (engines/flow.py says what it decides).

It is sent as one message of two statements, which the server runs as one implicit
transaction (the protocol's rule for a simple query holding several statements; psycopg's
client-side-binding cursor, Django's default, sends them so):

1. The success marks, and the lock of the queue's row (``FOR UPDATE``): every limited
   claim of the queue, in every worker, waits here for the one before it to commit.
2. The claim, one statement whose snapshot is taken after the lock was granted (under
   READ COMMITTED each statement takes its own), so that it counts the running jobs and
   the ledger's starts as the previous holder of the lock committed them. Counted by the
   first statement, they would predate that commit, and two workers could take the same
   last slot (tests/test_flow_control.py holds the lock from another connection to tell
   the two apart). It reads the queue's limits from the locked row, a chunk of ready rows
   in claim order (from the keyset positions of engines/flow.py), each key's room (its
   class's concurrency minus its running rows, its rate minus its ledger starts), keeps
   per key the first rows that fit (``row_number()`` over the key), takes what fits the
   queue's budget, marks them running with the clock read after the lock as their claim
   time, writes a ledger row per start and rate scope, and deletes the ledger rows of
   those scopes that left their window.

The second statement is prepared once per session (``PREPARE``, then ``EXECUTE``): it takes
longer to plan than to run. Not behind a transaction pooler, where the next transaction
may run in another session; there it is sent whole. It leaves out what a claim does not
need (the per-key rooms when it reads no keyed rows, the ledger when it expects no rate);
a statement without the rates takes nothing of a queue whose row has one, nor any row of
a class with one, and its answer says so (the caller claims again with them).

The answer also says how many rows the chunk held and how many fitted: a full chunk that
fitted fewer than the budget may hide more beyond it (a backlog of one key), which the
caller's walk (engines/flow.py, a transaction of its own) goes on to. And it gives the
first keyed row of the chunk not taken, for the caller's keyset positions. The class
limits travel as arrays: the worker's registered classes with limits (a name not among
them has none, as in engines/flow.py).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django_gator.attempts import Mark
from django_gator.engines.base import JOB_COLUMNS, KEYED_SQL, UNKEYED_SQL, ClaimedJob
from django_gator.models import FlowStart
from django_gator.states import READY_SQL, RUNNING_SQL, claim_set_sql

if TYPE_CHECKING:
    # Only a type here: importing the PostgreSQL engine imports psycopg, which a project
    # on SQLite or MariaDB need not have installed.
    from django_gator.engines.postgresql import PostgresEngine

#: No limit, as an SQL integer.
NO_LIMIT = 2_147_483_647
_JOB_COLUMN_NAMES = [c.strip() for c in JOB_COLUMNS.split(",")]
#: The figures each row of the answer starts with (see OneTripClaim._claim's last SELECT).
_INFO_COLUMNS = 12


@dataclass(frozen=True)
class Floor:
    """A keyset position of one kind of row: read its priority from after (due, id), or
    from ``lookback`` seconds before now if that is earlier; higher and lower priorities
    whole (see engines/flow.py)."""

    priority: int
    due: Any
    id: int


@dataclass(frozen=True)
class ClassRow:
    """One class's limits, as the statement reads them (None: not limited that way)."""

    name: str
    concurrency: int | None
    rate_starts: int | None
    rate_seconds: int | None


@dataclass(frozen=True)
class Request:
    """One claim: up to ``want`` jobs of ``queue`` for ``worker_id``, from a chunk of
    ``chunk`` rows of the kinds in ``floors`` (True: keyed; False: those without a key,
    read only if the queue has limits), each from its keyset position, if any.
    ``rates``: False leaves the rate limits out (see the module docstring)."""

    worker_id: str
    queue: str
    want: int
    chunk: int
    classes: Sequence[ClassRow]
    floors: dict[bool, Floor | None]
    rates: bool = True


@dataclass
class Trip:
    """What one claim did."""

    found: bool = False  # the queue has a row (else nothing was claimed)
    written: list[int] = field(default_factory=list)  # the success marks written
    jobs: list[ClaimedJob] = field(default_factory=list)
    keys: dict[int, str | None] = field(default_factory=dict)  # job id -> its key
    #: The first keyed row of the chunk not taken, if any: (id, name, key, priority, due).
    #: (Rows without a key are taken in order: those taken are a prefix of those read.)
    skipped: list[tuple[int, str, str | None, int, datetime]] = field(default_factory=list)
    more: bool = False  # a full chunk fitted fewer than wanted: more may lie beyond it
    rated: bool = False  # the queue's row has a rate limit
    rated_rows: int = 0  # rows of classes with a rate among those read
    bad_rate: bool = False  # the queue's rate_limit cannot be read: nothing claimed


def usable(engine: PostgresEngine) -> bool:
    """Whether this connection's cursors may send several statements at once: psycopg's
    client-side-binding cursor (Django's default). With ``server_side_binding`` each
    statement is prepared alone, and the claim of engines/flow.py is used instead."""
    import psycopg

    connection = engine.connection
    connection.ensure_connection()
    factory = getattr(connection.connection, "cursor_factory", None)
    return isinstance(factory, type) and issubclass(factory, psycopg.ClientCursor)


class _Sql:
    """A statement built a piece at a time, its parameters in the order of their ``%s``."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.params: list[Any] = []

    def add(self, sql: str, *params: Any) -> None:
        self.parts.append(sql)
        self.params += params

    @property
    def sql(self) -> str:
        return "".join(self.parts)


class OneTripClaim:
    """The limited claim of one PostgreSQL engine, in one round trip."""

    def __init__(self, engine: PostgresEngine, lookback: float) -> None:
        self.engine = engine
        self.lookback = lookback
        self.ledger_table = engine.connection.ops.quote_name(FlowStart._meta.db_table)

    def claim(self, request: Request, marks: Sequence[Mark] = ()) -> Trip:
        """Make the claim of ``request``, writing the success ``marks`` first (see the
        module docstring)."""
        lock, claim = _Sql(), _Sql()
        self._lock(lock, request.worker_id, request.queue, marks)
        self._claim(claim, request)
        with self.engine.connection.cursor() as cursor:
            sql, params = claim.sql, claim.params
            if not self.engine.pooled:
                name = self._prepared(cursor, sql)
                sql = f"EXECUTE {name}({', '.join(['%s'] * len(params))})"
            cursor.execute(f"{lock.sql}; {sql}", [*lock.params, *params])
            first = cursor.fetchone()
            cursor.nextset()
            rows = cursor.fetchall()
        written = list(first[0] or []) if first is not None else []
        return self._trip(rows, written, request.chunk, keyed=True in request.floors)

    def _prepared(self, cursor: Any, sql: str) -> str:
        """The name of ``sql`` prepared in this connection's session, prepared now if it
        was not. A PREPARE outlives a rollback, so it is sent on its own."""
        raw = self.engine.connection.connection
        names: set[str] | None = getattr(raw, "_gator_prepared", None)
        if names is None:
            names = raw._gator_prepared = set()
        name = "gator_flow_" + hashlib.blake2b(sql.encode(), digest_size=10).hexdigest()
        if name not in names:
            numbers = iter(range(1, sql.count("%s") + 1))
            cursor.execute(f"PREPARE {name} AS " + re.sub("%s", lambda _: f"${next(numbers)}", sql))
            names.add(name)
        return name

    def _lock(
        self,
        statement: _Sql,
        worker_id: str,
        queue: str,
        marks: Sequence[Mark],
    ) -> None:
        """The first statement: the marks, then the lock; answers the ids marked."""
        lock = f"SELECT name FROM {self.engine.queue_table} WHERE name = %s FOR UPDATE"
        if not marks:
            statement.add(f"SELECT NULL::bigint[] FROM ({lock}) AS locked", queue)
            return
        marks_sql, marks_params = self.engine.marks_sql(worker_id, marks)
        statement.add(
            f"WITH m AS ({marks_sql}) SELECT (SELECT array_agg(id) FROM m) "
            f"FROM (SELECT 1) AS one LEFT JOIN ({lock}) AS locked ON true",
            *marks_params,
            queue,
        )

    def _claim(self, statement: _Sql, request: Request) -> None:
        """The second statement (see the module docstring), without the pieces a claim
        does not need: the per-key rooms without keyed rows, the ledger without rates."""
        queue, chunk, classes, floors, rates = (
            request.queue,
            request.chunk,
            request.classes,
            request.floors,
            request.rates,
        )
        job, ledger = self.engine.job_table, self.ledger_table
        keyed = True in floors
        now = "(SELECT now FROM t)"
        order = "priority DESC, due, id"
        add = statement.add
        add(
            "WITH t AS MATERIALIZED (SELECT x.now, x.now - %s::float8 * interval '1 second'"
            " AS since FROM (SELECT clock_timestamp() AS now) AS x),",
            self.lookback,
        )
        # The queue's row, read after the lock: as the previous holder committed it.
        rate = ""
        if rates:
            rate = (
                r", substring(rate_limit FROM '^\s*(\d{1,7})\s*/\s*[smh]\s*$')::int AS rate_n,"
                r" CASE substring(rate_limit FROM '^\s*\d{1,7}\s*/\s*([smh])\s*$')"
                " WHEN 's' THEN 1 WHEN 'm' THEN 60 WHEN 'h' THEN 3600 END AS rate_s"
            )
        add(
            " q AS MATERIALIZED (SELECT paused, concurrency, rate_limit,"
            f" concurrency IS NOT NULL OR rate_limit <> '' AS limited{rate}"
            f" FROM {self.engine.queue_table} WHERE name = %s),",
            queue,
        )
        # The queue's budget: the claim's want, its concurrency minus its running rows, its
        # rate minus its starts in the window; none when paused, or when its rate cannot be
        # read (or is left out of this statement).
        if rates:
            refused = "q.rate_limit <> '' AND (q.rate_s IS NULL OR q.rate_n < 1)"
            rate_room = (
                f"COALESCE(q.rate_n - (SELECT count(*) FROM {ledger} WHERE scope = %s"
                f" AND started_at > {now} - q.rate_s * interval '1 second'), {NO_LIMIT})"
            )
        else:
            refused, rate_room = "q.rate_limit <> ''", str(NO_LIMIT)
        add(
            f" budget AS MATERIALIZED (SELECT CASE WHEN q.paused OR {refused} THEN 0"
            " ELSE greatest(0, least(%s::int, COALESCE(q.concurrency - (SELECT count(*)"
            f" FROM {job} WHERE {RUNNING_SQL} AND queue = %s), {NO_LIMIT}), {rate_room}))"
            " END AS n FROM q),",
            request.want,
            queue,
            *([f"queue:{queue}"] if rates else []),
        )
        add(" cand AS MATERIALIZED (SELECT * FROM (")
        self._reads(statement, queue, floors, chunk)
        add(f") AS c ORDER BY {order} LIMIT %s),", chunk)
        if keyed:
            self._fits(statement, classes, rates)
        else:
            add(" fits AS (SELECT * FROM cand),")
        add(
            f" picked AS MATERIALIZED (SELECT id FROM fits ORDER BY {order}"
            " LIMIT COALESCE((SELECT n FROM budget), 0)),"
        )
        returning = ", ".join(f"j.{c}" for c in _JOB_COLUMN_NAMES)
        add(
            f" upd AS (UPDATE {job} AS j SET {claim_set_sql(now, 'j.')} FROM picked"
            f" WHERE j.id = picked.id AND j.{READY_SQL}"
            f" RETURNING {returning}, j.concurrency_key AS key)",
            request.worker_id,
        )
        if rates:
            self._ledger(statement, queue, keyed)
        # The answer: one row per job taken, each carrying the claim's figures (one row
        # with no job when none was).
        bad = f"(SELECT {refused} FROM q)" if rates else "false"
        add(
            " SELECT i.*, u.* FROM (SELECT (SELECT count(*) FROM q) AS found,"
            f" (SELECT rate_limit <> '' FROM q) AS rated, {bad} AS bad_rate,"
            " (SELECT count(*) FROM cand) AS read, (SELECT count(*) FROM fits) AS fitted,"
            " (SELECT n FROM budget) AS budget,"
        )
        rated = [c.name for c in classes if c.rate_starts is not None]
        if keyed and rated:
            add(
                " (SELECT count(*) FROM cand WHERE key IS NOT NULL AND name = ANY(%s::text[]))",
                rated,
            )
        else:
            add(" 0")
        add(" AS rated_rows, ks.* FROM (SELECT 1) AS one LEFT JOIN LATERAL (")
        if keyed:
            add(
                "SELECT id, name, key, priority, due FROM cand WHERE key IS NOT NULL"
                f" AND id NOT IN (SELECT id FROM picked) ORDER BY {order} LIMIT 1"
            )
        else:
            add(_NO_ROWS)
        add(") AS ks ON true) AS i LEFT JOIN upd AS u ON true")

    def _reads(
        self, statement: _Sql, queue: str, floors: dict[bool, Floor | None], chunk: int
    ) -> None:
        """The index reads of each kind of row: from the start of the queue's range, or,
        from a keyset position, that priority from the position and the others whole. Rows
        without a key are read only if the queue has limits."""
        columns = "id, name, concurrency_key AS key, priority, next_execution_at AS due"
        order = "ORDER BY priority DESC, next_execution_at, id LIMIT %s"
        since = "(SELECT since FROM t)"
        first = True
        for keyed, floor in floors.items():
            kind = KEYED_SQL if keyed else f"{UNKEYED_SQL} AND (SELECT limited FROM q)"
            base = (
                f"(SELECT {columns} FROM {self.engine.job_table} WHERE queue = %s"
                f" AND {READY_SQL} AND {kind} AND next_execution_at <= (SELECT now FROM t)"
            )
            reads: list[tuple[str, list[Any]]]
            if floor is None:
                reads = [(f" {order})", [chunk])]
            else:
                reads = [
                    (f" AND priority > %s {order})", [floor.priority, chunk]),
                    (
                        " AND priority = %s AND (next_execution_at, id) > ("
                        f"least(%s::timestamptz, {since}), "
                        f"CASE WHEN %s::timestamptz < {since} THEN %s::bigint ELSE 0 END)"
                        " ORDER BY next_execution_at, id LIMIT %s)",
                        [floor.priority, floor.due, floor.due, floor.id, chunk],
                    ),
                    (f" AND priority < %s {order})", [floor.priority, chunk]),
                ]
            for sql, params in reads:
                statement.add(("" if first else " UNION ALL ") + base + sql, queue, *params)
                first = False
        if first:
            statement.add(_NO_ROWS)

    def _fits(self, statement: _Sql, classes: Sequence[ClassRow], rates: bool) -> None:
        """The rows that fit their key's room: its class's concurrency minus its running
        rows (in every queue), its rate minus its starts in the window; per key, the first
        rows in claim order, as many as the room allows. (The room is read per row: a
        chunk holds few rows of one key, and a join would be planned for one row.)"""
        job, now = self.engine.job_table, "(SELECT now FROM t)"
        limited = [c for c in classes if c.concurrency is not None or rates]
        rooms = [
            f"COALESCE(p.conc - (SELECT count(*) FROM {job} AS r WHERE {RUNNING_SQL}"
            f" AND r.{KEYED_SQL} AND r.name = c.name AND r.concurrency_key = c.key), {NO_LIMIT})"
        ]
        policy = "unnest(%s::text[], %s::int[]) AS p(name, conc)"
        params: list[Any] = [[c.name for c in limited], [c.concurrency for c in limited]]
        if rates:
            rooms.append(
                f"COALESCE(p.rate_n - (SELECT count(*) FROM {self.ledger_table} AS s"
                " WHERE s.scope = 'job:' || c.name || '|' || c.key"
                f" AND s.started_at > {now} - p.rate_s * interval '1 second'), {NO_LIMIT})"
            )
            policy = (
                "unnest(%s::text[], %s::int[], %s::int[], %s::int[])"
                " AS p(name, conc, rate_n, rate_s)"
            )
            params += [[c.rate_starts for c in limited], [c.rate_seconds for c in limited]]
        rated = [c.name for c in classes if c.rate_starts is not None]
        not_rated = "" if rates or not rated else _NOT_RATED
        statement.add(
            f" pol AS MATERIALIZED (SELECT * FROM {policy}),"
            " fits AS MATERIALIZED (SELECT c.* FROM (SELECT cand.*, row_number() OVER ("
            " PARTITION BY name, key ORDER BY priority DESC, due, id) AS rn FROM cand) AS c"
            f" WHERE (c.key IS NULL OR c.rn <= COALESCE((SELECT least({', '.join(rooms)})"
            f" FROM pol AS p WHERE p.name = c.name), {NO_LIMIT})){not_rated}),",
            *params,
            *([rated] if not_rated else []),
        )

    def _ledger(self, statement: _Sql, queue: str, keyed: bool) -> None:
        """One ledger row per start and rate scope; the scopes' rows past their window go."""
        ledger, now = self.ledger_table, "(SELECT now FROM t)"
        scope = f"queue:{queue}"
        keys = ""
        if keyed:
            keys = (
                " UNION ALL SELECT 'job:' || u.name || '|' || u.key, p.rate_s FROM upd AS u"
                " JOIN pol AS p ON p.name = u.name WHERE p.rate_s IS NOT NULL"
                " AND u.key IS NOT NULL"
            )
        statement.add(
            ", scopes AS MATERIALIZED (SELECT %s::text AS scope, q.rate_s FROM upd, q"
            f" WHERE q.rate_s IS NOT NULL{keys}),"
            f" ins AS (INSERT INTO {ledger} (scope, started_at) SELECT scope, {now}"
            " FROM scopes),"
            f" del AS (DELETE FROM {ledger} AS l USING (SELECT DISTINCT scope, rate_s"
            " FROM scopes) AS w WHERE l.scope = w.scope"
            f" AND l.started_at <= {now} - w.rate_s * interval '1 second')",
            scope,
        )

    def _trip(self, rows: list[Any], written: list[int], chunk: int, *, keyed: bool) -> Trip:
        found, rated, bad_rate, read, fitted, budget, rated_rows = rows[0][:7]
        trip = Trip(
            found=bool(found),
            written=written,
            rated=bool(rated),
            rated_rows=int(rated_rows),
            bad_rate=bool(bad_rate),
        )
        if not trip.found:
            return trip
        # A full chunk whose rows fitted fewer than the budget: a walk may find more.
        trip.more = keyed and read >= chunk and fitted < (budget or 0)
        left = rows[0][7:_INFO_COLUMNS]
        if left[0] is not None:
            trip.skipped.append(tuple(left))
        for row in rows:
            job_row = row[_INFO_COLUMNS:]
            if job_row[0] is None:
                continue
            job = self.engine.claimed(job_row[:-1])
            trip.jobs.append(job)
            trip.keys[job.id] = job_row[-1]
        return trip


#: Without the rate limits in the statement, the rows of classes with a rate do not fit.
_NOT_RATED = " AND NOT (c.key IS NOT NULL AND c.name = ANY(%s::text[]))"

#: A read of no rows, with the columns of the others.
_NO_ROWS = (
    "SELECT NULL::bigint AS id, NULL::varchar AS name, NULL::varchar AS key,"
    " NULL::smallint AS priority, NULL::timestamptz AS due WHERE false"
)
