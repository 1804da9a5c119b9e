"""PostgreSQL: one-statement claims with FOR UPDATE SKIP LOCKED, unnest() bulk inserts,
and NOTIFY on dispatch (delivered by PostgreSQL only when the transaction commits).

The engine is composed of its parts, one module each: the inserts and COPY
(engines/postgresql_inserts.py, engines/postgresql_copy.py), the claims and success marks
(engines/postgresql_claims.py), the sessions, LISTEN/NOTIFY and the prepared cursor
(engines/postgresql_sessions.py)."""

from __future__ import annotations

import psycopg

from django_gator import conf
from django_gator.engines.fairness import FairInserts
from django_gator.engines.postgresql_claims import PostgresClaims
from django_gator.engines.postgresql_inserts import PostgresInserts
from django_gator.states import ACTIVE_SQL, RUNNING_SQL


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
