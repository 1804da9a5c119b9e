"""PostgreSQL: one-statement claims with FOR UPDATE SKIP LOCKED, unnest() bulk inserts,
and NOTIFY on dispatch (delivered by PostgreSQL only when the transaction commits).

The engine is composed of its parts, one module each: the inserts and COPY
(engines/postgresql_inserts.py, engines/postgresql_copy.py), the claims and success marks
(engines/postgresql_claims.py), the sessions, LISTEN/NOTIFY and the prepared cursor
(engines/postgresql_sessions.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

import psycopg

from django_gator import conf
from django_gator.engines.fairness import FairInserts
from django_gator.engines.postgresql_claims import PostgresClaims
from django_gator.engines.postgresql_inserts import PostgresInserts
from django_gator.states import ACTIVE_SQL, RUNNING_SQL, JobState, sql_list, sql_literal

if TYPE_CHECKING:
    from django_gator.models.settling import FinishedStep

#: The final states of the finished jobs' time partitions, and the dead jobs' partition's.
ENDED_SQL = sql_list([JobState.SUCCEEDED, JobState.CANCELLED])
DEAD_SQL = sql_literal(JobState.DEAD)
CLOCK_MARGIN = timedelta(minutes=1)


class PostgresEngine(FairInserts, PostgresInserts, PostgresClaims):
    vendor = "postgresql"
    can_listen = True
    _json_param = "%s::jsonb"
    now_sql = "statement_timestamp()"
    later_sql = "statement_timestamp() + %s::float8 * interval '1 second'"

    def is_deadlock(self, exc: BaseException) -> bool:
        """PostgreSQL's deadlock detector ended the transaction (SQLSTATE 40P01); Django
        wraps psycopg's error, which it keeps as the cause."""
        return isinstance(exc, psycopg.errors.DeadlockDetected) or isinstance(
            exc.__cause__, psycopg.errors.DeadlockDetected
        )

    def finished_steps(self, job_ids: Sequence[int]) -> list[FinishedStep] | None:
        """On partitioned storage, the rows looked up where they now are with the finished
        jobs' partitions to plan bounded by time. Found by id alone, PostgreSQL planned
        every partition of the finished jobs (a day of hourly ones made ahead: 5-11 ms a
        lookup, against 0.3 ms to run it; docs/benchmarks.md). The write that ended them
        ran in this transaction, so their ``finished_at`` lies between the transaction's
        start and now: read first, and given as constants (a minute wider each side),
        those bound the partitions planned to the one or two of that time. Dead jobs have
        their own partition."""
        if conf.partitioning() is None:
            return None  # one table: the ORM's query plans cheaply
        ids = ", ".join(["%s"] * len(job_ids))
        columns = "id, chain_id, chain_position, state, batch_id"
        where = f"id IN ({ids}) AND chain_id IS NOT NULL"
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT transaction_timestamp(), statement_timestamp()")
            since, until = cursor.fetchone()
            cursor.execute(
                f"SELECT {columns} FROM {self.job_table} WHERE {where} AND state IN {ENDED_SQL}"
                " AND finished_at >= %s AND finished_at <= %s"
                f" UNION ALL SELECT {columns} FROM {self.job_table} WHERE {where}"
                f" AND state = {DEAD_SQL}",
                # A minute's margin each side, against a step of the server's clock.
                [*job_ids, since - CLOCK_MARGIN, until + CLOCK_MARGIN, *job_ids],
            )
            return [tuple(row) for row in cursor.fetchall()]

    def _guard(self, condition: str) -> str:
        # Inside a CASE the conditions can neither drive an index scan nor prove a partial
        # index's predicate, so the planner has only the primary key to find the row by.
        guard = f"CASE WHEN {condition} AND {RUNNING_SQL} AND reserved_by = %s THEN true END"
        if conf.partitioning() is not None:
            # Partitioned storage: the active states outside the CASE, so that the planner
            # looks in the active partition only (engines/partitions.py). Not ``running``:
            # that would prove the partial indexes of running jobs and be looked up there.
            return f"{ACTIVE_SQL} AND {guard}"
        return guard
