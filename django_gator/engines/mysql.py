"""MySQL 8 / MariaDB 10.6+: SELECT ... FOR UPDATE SKIP LOCKED in a short READ COMMITTED
transaction, then one UPDATE of the picked ids.

MySQL has no partial indexes, so migration 0002 adds a virtual column ``ready_rank``
(``-priority`` while the job is waiting or failed, NULL otherwise) and the index
``(queue, ready_rank, next_execution_at, id)``. The claim walks that index in order and stops
after ``limit`` rows; without it InnoDB would lock every row it scanned and SKIP LOCKED would
starve the other workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import OperationalError

from django_gator import conf
from django_gator.engines.base import JOB_COLUMNS, ClaimedJob, InsertRow, Position
from django_gator.engines.batching import DEAD
from django_gator.engines.dispatching import answered
from django_gator.engines.fairness import FairInserts
from django_gator.models.membership import LOCKED
from django_gator.rows import Inserted, JobRows
from django_gator.states import (
    READY_SQL,
    SQL_CANCELLED,
    SQL_WAITING,
    claim_set_sql,
    live_sql,
)

if TYPE_CHECKING:
    from django_gator.worker.connections import NetworkBounds

READY_INDEX = "gator_job_ready_my"
#: The fair claim's index (engines/schema_fairness.py).
FAIR_INDEX = "gator_job_fair_my"


class MySQLEngine(FairInserts):
    vendor = "mysql"
    now_sql = "UTC_TIMESTAMP(6)"
    later_sql = "TIMESTAMPADD(MICROSECOND, ROUND(%s * 1000000), UTC_TIMESTAMP(6))"
    update_returning = False

    _mark_in_claim_transaction = True

    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        # Compare-and-set writes look rows up by primary key, never through the
        # (state, reserved_by) index, whatever the optimizer estimates.
        self._cas_table_sql = f"{self.job_table} FORCE INDEX (PRIMARY)"

    @contextmanager
    def write_transaction(self) -> Iterator[Any]:
        # START TRANSACTION ... COMMIT: two round trips fewer than toggling autocommit.
        with self._raw_transaction("START TRANSACTION") as cursor:
            yield cursor

    def prepare_worker_session(self, raw: Any, bounds: NetworkBounds) -> None:
        """MariaDB sets its TCP keepalive for the whole server only (``tcp_keepalive_time``,
        global), so the server side is bounded by ``idle_transaction_timeout``: a session
        left idle inside a transaction that long is disconnected and its transaction rolled
        back, which frees its locks. (``idle_write_transaction_timeout`` would spare a
        transaction that only locked rows with SELECT ... FOR UPDATE.) The cost: a live
        worker's job that leaves its transaction idle that long loses it too. A session
        idle outside a transaction holds no lock and is left alone (``wait_timeout`` would
        also cut a long job that uses its connection again after a pause). MySQL has no
        such setting: there the server's side keeps its defaults."""
        if "mariadb" not in raw.get_server_info().lower():
            return
        cursor = raw.cursor()
        try:
            cursor.execute(
                "SET SESSION idle_transaction_timeout = %s", [bounds.idle_transaction_timeout]
            )
        finally:
            cursor.close()

    def ready_condition(self) -> str:
        return "ready_rank IS NOT NULL"

    def keyed_ready_condition(self) -> str:
        return "flow_rank IS NOT NULL"

    def _ready_gauge_conditions(self) -> list[str]:
        # The ready indexes lead with the queue and hold a NULL rank for every finished row:
        # a count over all queues would read all of them. The (state, queue) index goes
        # straight to the waiting and failed rows.
        return [READY_SQL]

    # The virtual column behind the unique index holds the key only while the job is active.
    _unique_match_sql = "name = %s AND unique_active = %s"

    def _unique_lookup_lock(self) -> str:
        """A locking read only where a plain one could be stale.

        Under READ COMMITTED (Django's default for MySQL) every plain read sees the newest
        commits, so the lookup takes no lock. It must not: a locking read through the unique
        index locks the index entry, then the row, while a worker marking that row succeeded
        holds the row and then needs the entry (the virtual column changes), and InnoDB
        kills one of the two with a deadlock (error 1213). Under REPEATABLE READ or
        SERIALIZABLE a plain read sees the transaction's snapshot, which can predate the
        commit that took or freed the key; there the lookup stays a locking read, and
        dispatch retries its deadlocks when the transaction is its own.
        """
        level = getattr(self.connection, "isolation_level", None)
        if level in ("read committed", "read uncommitted"):
            return ""
        return " LOCK IN SHARE MODE"

    #: ER_LOCK_DEADLOCK, and ER_AUTOINC_READ_FAILED, which is how MariaDB reports a deadlock
    #: met while taking the AUTO-INC lock of an INSERT ... SELECT.
    DEADLOCK_ERRORS = (1213, 1467)

    def is_deadlock(self, exc: BaseException) -> bool:
        return bool(exc.args) and exc.args[0] in self.DEADLOCK_ERRORS

    #: ER_LOCK_WAIT_TIMEOUT (MariaDB's NOWAIT) and ER_LOCK_NOWAIT (MySQL's).
    NOWAIT_ERRORS = (1205, 3572)

    def _member_in(self, cursor: Any, batch_id: int, state_sql: str) -> int | None:
        """A locking read, so it sees the newest commit whatever this transaction's
        snapshot (REPEATABLE READ), with NOWAIT, so it never waits while holding the batch
        row: a member locked by another transaction is being written by it, which then
        settles the batch itself, after our commit; it is answered LOCKED. (A plain wait
        could deadlock with that transaction, which holds the member and waits for the
        batch row.)"""
        try:
            cursor.execute(
                f"SELECT id FROM {self.job_table} FORCE INDEX (gator_job_batch) "
                f"WHERE batch_id = %s AND state {state_sql} LIMIT 1 FOR UPDATE NOWAIT",
                [batch_id],
            )
        except OperationalError as exc:
            if exc.args and exc.args[0] in self.NOWAIT_ERRORS:
                return LOCKED  # only the statement failed; the transaction goes on
            raise
        row = cursor.fetchone()
        return None if row is None else int(row[0])

    def _probe_members(self, cursor: Any, batch_id: int) -> tuple[bool, int | None, int | None]:
        # Three locking reads (see _member_in); a scalar subquery cannot lock NOWAIT.
        return (
            self._has_active_members(cursor, batch_id),
            self._member_in(cursor, batch_id, DEAD),
            self._member_in(cursor, batch_id, f"= {SQL_CANCELLED}"),
        )

    def insert_rows(
        self,
        rows: JobRows,
        notify: set[str] | None = None,
        prepare: Callable[[int], None] | None = None,
        meanwhile: Callable[[Inserted], None] | None = None,
    ) -> Inserted:
        if self.connection.features.can_return_rows_from_bulk_insert:
            return super().insert_rows(rows, notify, prepare, meanwhile)
        if prepare is not None:
            prepare(len(rows))
        return answered(self.insert_jobs(rows.rows(), notify), meanwhile)

    def insert_jobs(
        self, rows: Sequence[InsertRow], notify: set[str] | None = None
    ) -> list[tuple[int, datetime, datetime]]:
        if self.connection.features.can_return_rows_from_bulk_insert:
            return super().insert_jobs(rows, notify)
        # MySQL 8 has no INSERT ... RETURNING: one row at a time, reading the new id.
        out = []
        with self.write_transaction() as cursor:
            for row in rows:
                cursor.execute(
                    f"INSERT INTO {self.job_table} (name, args, kwargs, queue, priority, state, "
                    "attempts, rescues, next_execution_at, created_at, last_error, chain_id, "
                    "chain_position, chain, unique_key, batch_id, concurrency_key) VALUES (%s, %s, "
                    f"%s, %s, %s, {SQL_WAITING}, 0, 0, COALESCE(%s, {self.now_sql}), "
                    f"{self.now_sql}, '', %s, %s, %s, %s, %s, %s)",
                    [
                        row.name,
                        row.args,
                        row.kwargs,
                        row.queue,
                        row.priority,
                        self.adapt_dt(row.run_at),
                        row.chain_id,
                        row.chain_position,
                        row.chain,
                        row.unique_key,
                        row.batch_id,
                        row.concurrency_key,
                    ],
                )
                job_id = cursor.lastrowid
                cursor.execute(
                    f"SELECT created_at, next_execution_at FROM {self.job_table} WHERE id = %s",
                    [job_id],
                )
                created_at, next_at = cursor.fetchone()
                out.append((job_id, self.to_dt(created_at), self.to_dt(next_at)))
        self.wake(notify or ())
        return out

    def insert_sql(self) -> str:
        text = "CHARACTER SET utf8mb4"
        return (
            f"INSERT INTO {self.job_table} (name, args, kwargs, queue, priority, state, "
            "attempts, rescues, next_execution_at, created_at, last_error, chain_id, "
            "chain_position, chain, unique_key, batch_id, concurrency_key) SELECT j.name, j.a, "
            f"j.k, j.queue, j.priority, {SQL_WAITING}, 0, 0, "
            f"COALESCE(j.run_at, {self.now_sql}), {self.now_sql}, '', j.chain_id, "
            "j.chain_position, j.chain, j.unique_key, j.batch_id, j.ck "
            "FROM JSON_TABLE(%s, '$[*]' COLUMNS ("
            "ord FOR ORDINALITY, "
            f"name VARCHAR(255) {text} PATH '$[0]', "
            f"a LONGTEXT {text} PATH '$[1]', "
            f"k LONGTEXT {text} PATH '$[2]', "
            f"queue VARCHAR(100) {text} PATH '$[3]', "
            "priority SMALLINT PATH '$[4]', "
            "run_at DATETIME(6) PATH '$[5]', "
            "chain_id CHAR(32) PATH '$[6]', "
            "chain_position SMALLINT PATH '$[7]', "
            f"chain LONGTEXT {text} PATH '$[8]', "
            f"unique_key VARCHAR(200) {text} PATH '$[9]', "
            "batch_id BIGINT PATH '$[10]', "
            f"ck VARCHAR(200) {text} PATH '$[11]')) AS j ORDER BY j.ord "
            "RETURNING id, created_at, next_execution_at"
        )

    @property
    def fair_head_sql(self) -> str:
        return (
            f"SELECT fair_order FROM {self.job_table} FORCE INDEX ({FAIR_INDEX})"
            " WHERE queue = %s AND fair_rank = -(%s)"
            f" AND next_execution_at <= {self.now_sql} ORDER BY fair_rank, fair_order, id LIMIT 1"
        )

    @property
    def fair_floor_sql(self) -> str:
        return (
            f"SELECT MIN(fair_order) FROM {self.job_table} FORCE INDEX ({FAIR_INDEX})"
            f" WHERE queue = %s AND fair_rank IS NOT NULL AND next_execution_at <= {self.now_sql}"
        )

    @property
    def fair_waiting_sql(self) -> str:
        return (
            f"SELECT 1 FROM {self.job_table} FORCE INDEX ({FAIR_INDEX})"
            " WHERE queue = %s AND fair_rank IS NOT NULL LIMIT 1"
        )

    def _advance(self, cursor: Any, queue: str, key: str, virtual: float, step: float) -> float:
        # No RETURNING after ON DUPLICATE KEY UPDATE: the row is ours until the commit.
        cursor.execute(
            f"INSERT INTO {self.share_table} (queue, fairness_key, last_stamp, updated_at)"
            f" VALUES (%s, %s, %s, {self.now_sql}) ON DUPLICATE KEY UPDATE"
            f" last_stamp = GREATEST(last_stamp, %s) + %s, updated_at = {self.now_sql}",
            [queue, key, virtual + step, virtual, step],
        )
        cursor.execute(
            f"SELECT last_stamp FROM {self.share_table} WHERE queue = %s AND fairness_key = %s",
            [queue, key],
        )
        return float(cursor.fetchone()[0])

    def claim(
        self, worker_id: str, queue: str, limit: int, after: Position | None = None
    ) -> list[ClaimedJob]:
        with self.write_transaction() as cursor:
            return self._claim(cursor, worker_id, queue, limit)

    def _claim(self, cursor: Any, worker_id: str, queue: str, limit: int) -> list[ClaimedJob]:
        # A fair queue: by (priority, stamp, id), through its own index (docs/fairness.md).
        index, rank, then = (
            (FAIR_INDEX, "fair_rank", "fair_order")
            if queue in conf.fairness()
            else (READY_INDEX, "ready_rank", "next_execution_at")
        )
        select = (
            f"SELECT {JOB_COLUMNS} FROM {self.job_table} FORCE INDEX ({index})"
            f" WHERE queue = %s AND {rank} IS NOT NULL"
            f" AND next_execution_at <= {self.now_sql} AND {live_sql(self.now_sql)}"
            f" AND {self.not_paused_sql}"
            f" ORDER BY {rank}, {then}, id LIMIT %s FOR UPDATE SKIP LOCKED"
        )
        cursor.execute(select, [queue, queue, limit])
        rows = cursor.fetchall()
        if not rows:
            return []
        ids = [row[0] for row in rows]
        cursor.execute(
            f"UPDATE {self.job_table} SET {claim_set_sql(self.now_sql)}"
            f" WHERE id IN ({', '.join(['%s'] * len(ids))})",
            [worker_id, *ids],
        )
        return [self.claimed(row, attempts_offset=1) for row in rows]
