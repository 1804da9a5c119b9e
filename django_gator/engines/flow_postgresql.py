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

The second statement (built by engines/flow_statement.py) is prepared once per session
(``PREPARE``, then ``EXECUTE``): it takes longer to plan than to run. Not behind a
transaction pooler, where the next transaction may run in another session; there it is
sent whole. It leaves out what a claim does not need (the per-key rooms when it reads no
keyed rows, the ledger when it expects no rate); a statement without the rates takes
nothing of a queue whose row has one, nor any row of a class with one, and its answer says
so (the caller claims again with them).

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
from django_gator.engines.base import ClaimedJob
from django_gator.engines.flow_statement import ClaimStatement, Request, Sql
from django_gator.models import FlowStart

if TYPE_CHECKING:
    # Only a type here: importing the PostgreSQL engine imports psycopg, which a project
    # on SQLite or MariaDB need not have installed.
    from django_gator.engines.postgresql import PostgresEngine

#: The figures each row of the answer starts with (see ClaimStatement._answer).
_INFO_COLUMNS = 12


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


class OneTripClaim:
    """The limited claim of one PostgreSQL engine, in one round trip."""

    def __init__(self, engine: PostgresEngine, lookback: float) -> None:
        self.engine = engine
        ledger_table = engine.connection.ops.quote_name(FlowStart._meta.db_table)
        self.statement = ClaimStatement(
            engine.job_table, engine.queue_table, ledger_table, lookback
        )

    def claim(self, request: Request, marks: Sequence[Mark] = ()) -> Trip:
        """Make the claim of ``request``, writing the success ``marks`` first (see the
        module docstring)."""
        lock = Sql()
        self._lock(lock, request.worker_id, request.queue, marks)
        claim = self.statement.build(request)
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
        statement: Sql,
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
