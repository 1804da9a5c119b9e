"""The claim statement of PostgreSQL's one-trip limited claim (engines/flow_postgresql.py
says what it does and how it is sent): what it is asked (:class:`Request`) and how it is
built, leaving out the pieces a claim does not need.

Its steps, as CTEs: the clock (``t``), the queue's row read after the lock (``q``), the
queue's budget (``budget``), a chunk of ready rows in claim order (``cand``), the rows that
fit their key's room (``fits``), those the budget takes (``picked``), their claim
(``upd``), the ledger's rows (``scopes``, ``ins``, ``del``), then the answer: one row per
job taken, each with the claim's figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django_gator import conf
from django_gator.engines.base import JOB_COLUMNS, KEYED_SQL, UNKEYED_SQL
from django_gator.engines.core import BY_PICKED_IDS
from django_gator.engines.flow_keyset import Floor
from django_gator.states import ACTIVE_SQL, READY_SQL, RUNNING_SQL, claim_set_sql, live_sql

#: No limit, as an SQL integer.
NO_LIMIT = 2_147_483_647
_JOB_COLUMN_NAMES = [c.strip() for c in JOB_COLUMNS.split(",")]
#: The claim's clock, read after the lock.
_NOW = "(SELECT now FROM t)"
#: The claim order of the rows read.
_ORDER = "priority DESC, due, id"


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
    ``rates``: False leaves the rate limits out (see engines/flow_postgresql.py)."""

    worker_id: str
    queue: str
    want: int
    chunk: int
    classes: Sequence[ClassRow]
    floors: dict[bool, Floor | None]
    rates: bool = True


class Sql:
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


class ClaimStatement:
    """Builds the claim statement of one engine's one-trip claims."""

    def __init__(self, job_table: str, queue_table: str, ledger_table: str, lookback: float):
        self.job_table = job_table
        self.queue_table = queue_table
        self.ledger_table = ledger_table
        self.lookback = lookback

    def build(self, request: Request) -> Sql:
        """The statement of ``request``, without the pieces it does not need: the per-key
        rooms without keyed rows, the ledger without rates."""
        statement = Sql()
        refused = self._budget(statement, request)
        self._claimed(statement, request)
        if request.rates:
            self._ledger(statement, request.queue, True in request.floors)
        self._answer(statement, request, refused)
        return statement

    def _budget(self, statement: Sql, request: Request) -> str:
        """The clock, the queue's row and its budget; returns the SQL for "the queue's
        rate cannot be read" (or is left out of the statement)."""
        queue, rates = request.queue, request.rates
        statement.add(
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
        statement.add(
            " q AS MATERIALIZED (SELECT paused, concurrency, rate_limit,"
            f" concurrency IS NOT NULL OR rate_limit <> '' AS limited{rate}"
            f" FROM {self.queue_table} WHERE name = %s),",
            queue,
        )
        # The queue's budget: the claim's want, its concurrency minus its running rows, its
        # rate minus its starts in the window; none when paused, or when its rate cannot be
        # read (or is left out of this statement).
        if rates:
            refused = "q.rate_limit <> '' AND (q.rate_s IS NULL OR q.rate_n < 1)"
            rate_room = (
                f"CASE WHEN q.rate_n IS NULL THEN {NO_LIMIT} ELSE q.rate_n - (SELECT count(*)"
                f" FROM {self.ledger_table} WHERE scope = %s"
                f" AND started_at > {_NOW} - q.rate_s * interval '1 second') END"
            )
        else:
            refused, rate_room = "q.rate_limit <> ''", str(NO_LIMIT)
        # Each count inside a CASE, which runs it only for a queue with that limit: an
        # operand of COALESCE is evaluated whether or not its other one is NULL, and the
        # count of the queue's running rows walks every entry of the partial index, dead
        # ones too (a long transaction keeps every job's; issue 32 item 5).
        statement.add(
            f" budget AS MATERIALIZED (SELECT CASE WHEN q.paused OR {refused} THEN 0"
            " ELSE greatest(0, least(%s::int, CASE WHEN q.concurrency IS NULL THEN"
            f" {NO_LIMIT} ELSE q.concurrency - (SELECT count(*) FROM {self.job_table}"
            f" WHERE {RUNNING_SQL} AND queue = %s) END, {rate_room})) END AS n FROM q),",
            request.want,
            queue,
            *([f"queue:{queue}"] if rates else []),
        )
        return refused

    def _claimed(self, statement: Sql, request: Request) -> None:
        """The rows read, those that fit, those picked, and their claim."""
        add = statement.add
        add(" cand AS MATERIALIZED (SELECT * FROM (")
        self._reads(statement, request.queue, request.floors, request.chunk)
        add(f") AS c ORDER BY {_ORDER} LIMIT %s),", request.chunk)
        if True in request.floors:
            self._fits(statement, request.classes, request.rates)
        else:
            add(" fits AS (SELECT * FROM cand),")
        add(
            f" picked AS MATERIALIZED (SELECT id FROM fits ORDER BY {_ORDER}"
            " LIMIT COALESCE((SELECT n FROM budget), 0)),"
        )
        returning = ", ".join(f"j.{c}" for c in _JOB_COLUMN_NAMES)
        # The picked rows are found by their ids alone, whatever the plan: the statement is
        # prepared, and its generic plan is made at a session's first claim, on a table
        # then near empty, and again after each ANALYZE of it. Joined with ``picked``, it
        # could walk the whole primary key as the outer side of a nested loop; with the
        # ready check as a plain condition, the whole (state, finished_at) index from the
        # first ready state; every entry a long transaction keeps dead too (2,546-2,689
        # buffers a claim that took nothing on the plain table; issue 32 item 5). So the
        # ids as an array the primary key takes, without the join (the two together made
        # the limited drain a quarter slower: docs/benchmarks.md), and the ready check
        # inside a CASE, which no index serves (as in the success marks); partitioned
        # storage names the active states outside it, for the planner to read the active
        # partition only.
        active = f"j.{ACTIVE_SQL} AND " if conf.partitioning() is not None else ""
        add(
            f" upd AS (UPDATE {self.job_table} AS j SET {claim_set_sql(_NOW, 'j.')}"
            f" WHERE {BY_PICKED_IDS} AND {active}CASE WHEN j.{READY_SQL}"
            f" AND {live_sql(_NOW, 'j.')} THEN true END"
            f" RETURNING {returning}, j.concurrency_key AS key)",
            request.worker_id,
        )

    def _answer(self, statement: Sql, request: Request, refused: str) -> None:
        """One row per job taken, each carrying the claim's figures (one row with no job
        when none was): see OneTripClaim's reading of it."""
        add = statement.add
        keyed = True in request.floors
        bad = f"(SELECT {refused} FROM q)" if request.rates else "false"
        add(
            " SELECT i.*, u.* FROM (SELECT (SELECT count(*) FROM q) AS found,"
            f" (SELECT rate_limit <> '' FROM q) AS rated, {bad} AS bad_rate,"
            " (SELECT count(*) FROM cand) AS read, (SELECT count(*) FROM fits) AS fitted,"
            " (SELECT n FROM budget) AS budget,"
        )
        rated = [c.name for c in request.classes if c.rate_starts is not None]
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
                f" AND id NOT IN (SELECT id FROM picked) ORDER BY {_ORDER} LIMIT 1"
            )
        else:
            add(_NO_ROWS)
        add(") AS ks ON true) AS i LEFT JOIN upd AS u ON true")

    def _reads(
        self, statement: Sql, queue: str, floors: dict[bool, Floor | None], chunk: int
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
                f"(SELECT {columns} FROM {self.job_table} WHERE queue = %s"
                f" AND {READY_SQL} AND {kind} AND next_execution_at <= (SELECT now FROM t)"
                f" AND {live_sql(_NOW)}"
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

    def _fits(self, statement: Sql, classes: Sequence[ClassRow], rates: bool) -> None:
        """The rows that fit their key's room: its class's concurrency minus its running
        rows (in every queue), its rate minus its starts in the window; per key, the first
        rows in claim order, as many as the room allows. (The room is read per row: a
        chunk holds few rows of one key, and a join would be planned for one row.)"""
        job, now = self.job_table, "(SELECT now FROM t)"
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

    def _ledger(self, statement: Sql, queue: str, keyed: bool) -> None:
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


#: Without the rate limits in the statement, the rows of classes with a rate do not fit.
_NOT_RATED = " AND NOT (c.key IS NOT NULL AND c.name = ANY(%s::text[]))"

#: A read of no rows, with the columns of the others.
_NO_ROWS = (
    "SELECT NULL::bigint AS id, NULL::varchar AS name, NULL::varchar AS key,"
    " NULL::smallint AS priority, NULL::timestamptz AS due WHERE false"
)
