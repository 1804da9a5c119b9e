"""The engine contract and the SQL shared by every database.

Every write after a claim is a compare-and-set on the claim: ``id`` + ``state = 'running'``
+ ``attempts`` + ``reserved_by``. Zero rows changed means the job is no longer ours (it was
rescued, re-claimed or changed by an operator): the caller logs it and writes nothing else.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connections, transaction
from django.utils.dateparse import parse_datetime

READY_SQL = "state IN ('waiting', 'failed')"
JOB_COLUMNS = (
    "id, name, args, kwargs, queue, priority, attempts, rescues, chain_id, chain_position, chain"
)


@dataclass(slots=True)
class ClaimedJob:
    """A job a worker holds: what it needs to run it and to write its outcome."""

    id: int
    name: str
    args: Any
    kwargs: Any
    queue: str
    priority: int
    attempts: int
    rescues: int
    chain_id: Any = None
    chain_position: int | None = None
    chain: Any = None


@dataclass(slots=True)
class InsertRow:
    """One job to insert; the JSON is already validated and serialized."""

    name: str
    args: str
    kwargs: str
    queue: str
    priority: int
    run_at: datetime | None  # None: due now, by database time
    chain_id: str | None = None
    chain_position: int | None = None
    chain: str | None = None


@dataclass(slots=True)
class Failure:
    """What to write when an attempt failed."""

    dead: bool
    retry_at: datetime | None
    queue: str
    error: str  # one error-history entry, as JSON
    last_error: str


_ROW_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def loads(value: Any) -> Any:
    if isinstance(value, str | bytes | bytearray):
        return json.loads(value)
    return value


class Listener:
    """A wait for wakeups pushed by the database (PostgreSQL LISTEN)."""

    def wait(self, timeout: float) -> set[str]:
        """Queue names notified within ``timeout`` seconds (empty if none)."""
        raise NotImplementedError


class Engine:
    vendor = ""
    #: Whether listen() works: dispatch pushes a wakeup that workers can wait for.
    can_listen = False
    #: SQL for "now" in database time, as stored by Django for this vendor.
    now_sql = "CURRENT_TIMESTAMP"

    def __init__(self, alias: str) -> None:
        from django_gator.models import Job, Worker

        self.alias = alias
        qn = connections[alias].ops.quote_name
        self.job_table = qn(Job._meta.db_table)
        self.worker_table = qn(Worker._meta.db_table)

    # -- plumbing ------------------------------------------------------------------------
    @property
    def connection(self) -> Any:
        return connections[self.alias]

    def adapt_dt(self, value: datetime | None) -> Any:
        if value is None:
            return None
        return self.connection.ops.adapt_datetimefield_value(value)

    def to_dt(self, value: Any) -> datetime:
        if isinstance(value, str):
            parsed = parse_datetime(value)
            if parsed is None:
                raise ValueError(f"cannot read the timestamp {value!r}")
            value = parsed
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value

    @contextmanager
    def write_transaction(self) -> Iterator[Any]:
        """A short transaction for several writes; yields a cursor."""
        with transaction.atomic(using=self.alias), self.connection.cursor() as cursor:
            yield cursor

    @contextmanager
    def raw_transaction(self, begin: str) -> Iterator[Any]:
        """A transaction opened with ``begin`` on the cursor itself, outside Django's
        autocommit bookkeeping (fewer round trips than atomic() on some databases). Inside a
        caller's atomic block, or one of ours, it joins that transaction instead."""
        connection = self.connection
        if connection.in_atomic_block or getattr(connection, "_gator_in_transaction", False):
            with connection.cursor() as cursor:
                yield cursor
            return
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute(begin, [])
            connection._gator_in_transaction = True
            try:
                yield cursor
            except BaseException:
                connection._gator_in_transaction = False
                cursor.execute("ROLLBACK", [])
                raise
            connection._gator_in_transaction = False
            cursor.execute("COMMIT", [])

    def prepare_bookkeeping(self) -> None:
        """Tune this thread's connection for the worker's own writes (claims, outcome
        marks, heartbeats); called before each use, cheap when nothing changed."""

    def db_now(self) -> datetime:
        with self.connection.cursor() as cursor:
            cursor.execute(f"SELECT {self.now_sql}", [])
            return self.to_dt(cursor.fetchone()[0])

    def json_append_sql(self, column: str) -> str:
        """SQL that appends the JSON parameter ``%s`` to the array in ``column``."""
        raise NotImplementedError

    # -- dispatch --------------------------------------------------------------------------
    def insert_jobs(
        self, rows: Sequence[InsertRow], notify: set[str] | None = None
    ) -> list[tuple[int, datetime, datetime]]:
        """Insert jobs; returns (id, created_at, next_execution_at) per row, in order.

        ``notify``: queues whose idle workers should wake when the transaction commits
        (engines that can push a wakeup do; the others' workers poll).

        The rows travel as one JSON document expanded by the database (``json_each`` on
        SQLite, ``JSON_TABLE`` on MariaDB), so a dispatch_many of any length is a single
        INSERT with a single parameter. Only a document over :attr:`insert_bytes` is split,
        and the parts share one transaction.
        """
        documents = self._row_documents(rows)
        out: list[tuple[int, datetime, datetime]] = []
        parse = functools.lru_cache(maxsize=64)(self.to_dt)
        context = self.write_transaction() if len(documents) > 1 else self.connection.cursor()
        with context as cursor:
            for document in documents:
                cursor.execute(self.insert_sql(), [document])
                returned = sorted(cursor.fetchall())
                out += [(r[0], parse(r[1]), parse(r[2])) for r in returned]
        return out

    #: Largest JSON document of rows sent in one INSERT.
    insert_bytes = 4_000_000

    def insert_sql(self) -> str:
        """An INSERT ... SELECT ... RETURNING id, created_at, next_execution_at over the
        JSON document of rows ``%s`` (see _row_documents for its shape)."""
        raise NotImplementedError

    def _row_documents(self, rows: Sequence[InsertRow]) -> list[str]:
        """JSON arrays of ``[name, args, kwargs, queue, priority, run_at, chain_id,
        chain_position, chain]`` rows, each array under :attr:`insert_bytes`."""
        documents: list[str] = []
        parts: list[str] = []
        size = 0
        encode = _ROW_ENCODER.encode
        for row in rows:
            run_at = self.adapt_dt(row.run_at)
            part = encode(
                [
                    row.name,
                    row.args,
                    row.kwargs,
                    row.queue,
                    row.priority,
                    None if run_at is None else str(run_at),
                    row.chain_id,
                    row.chain_position,
                    row.chain,
                ]
            )
            if parts and size + len(part) > self.insert_bytes:
                documents.append("[" + ",".join(parts) + "]")
                parts, size = [], 0
            parts.append(part)
            size += len(part) + 1
        documents.append("[" + ",".join(parts) + "]")
        return documents

    @contextmanager
    def listen(self) -> Iterator[Listener]:
        raise NotImplementedError(f"{self.vendor} has no LISTEN; workers poll")
        yield  # pragma: no cover

    # -- claim -----------------------------------------------------------------------------
    def claim(self, worker_id: str, queue: str, limit: int) -> list[ClaimedJob]:
        """Atomically take up to ``limit`` due jobs of ``queue`` for ``worker_id``."""
        raise NotImplementedError

    def ready_queues(self) -> list[str]:
        """Names of the queues that hold waiting or failed jobs (a skip scan of the index)."""
        sql = (
            "WITH RECURSIVE q(queue) AS ("
            f" SELECT (SELECT queue FROM {self.job_table} WHERE {self.ready_condition()}"
            "  ORDER BY queue LIMIT 1)"
            " UNION ALL"
            f" SELECT (SELECT queue FROM {self.job_table} WHERE {self.ready_condition()}"
            "  AND queue > q.queue ORDER BY queue LIMIT 1) FROM q WHERE q.queue IS NOT NULL"
            ") SELECT queue FROM q WHERE queue IS NOT NULL"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [])
            return [row[0] for row in cursor.fetchall()]

    def ready_condition(self) -> str:
        return READY_SQL

    @staticmethod
    def claimed(row: Sequence[Any], attempts_offset: int = 0) -> ClaimedJob:
        return ClaimedJob(
            id=row[0],
            name=row[1],
            args=loads(row[2]),
            kwargs=loads(row[3]),
            queue=row[4],
            priority=row[5],
            attempts=row[6] + attempts_offset,
            rescues=row[7],
            chain_id=uuid.UUID(str(row[8])) if row[8] else None,
            chain_position=row[9],
            chain=loads(row[10]),
        )

    # -- outcomes (compare-and-set on the claim) ----------------------------------------
    CLAIM_MATCH = "id = %s AND state = 'running' AND attempts = %s AND reserved_by = %s"

    def mark_succeeded(
        self, worker_id: str, done: Sequence[tuple[int, int, str | None]]
    ) -> list[int]:
        """Mark (id, attempts, result_json) claims succeeded; returns the ids written."""
        with self.connection.cursor() as cursor:
            return self._mark_succeeded(cursor, worker_id, done)

    #: A JSON value as a query parameter.
    json_param = "%s"

    #: Whether UPDATE ... RETURNING works (it does not on MySQL and MariaDB).
    update_returning = True

    def _mark_succeeded(
        self, cursor: Any, worker_id: str, done: Sequence[tuple[int, int, str | None]]
    ) -> list[int]:
        """One UPDATE for the whole batch, each row matched on its claim."""
        ids = [d[0] for d in done]
        params: list[Any] = []
        attempts_case = "CASE id " + " ".join("WHEN %s THEN %s" for _ in done) + " END"
        for job_id, attempts, _ in done:
            params += [job_id, attempts]
        if any(d[2] is not None for d in done):
            with_result = [d for d in done if d[2] is not None]
            result_sql = (
                "CASE id "
                + " ".join(f"WHEN %s THEN {self.json_param}" for _ in with_result)
                + " ELSE NULL END"
            )
            result_params = [v for d in with_result for v in (d[0], d[2])]
        else:
            result_sql, result_params = "NULL", []
        sql = (
            f"UPDATE {self.job_table} SET state = 'succeeded', finished_at = {self.now_sql}, "
            f"result = {result_sql} WHERE id IN ({', '.join(['%s'] * len(ids))}) "
            f"AND state = 'running' AND reserved_by = %s AND attempts = {attempts_case}"
        )
        all_params = [*result_params, *ids, worker_id, *params]
        if self.update_returning:
            cursor.execute(sql + " RETURNING id", all_params)
            return [row[0] for row in cursor.fetchall()]
        cursor.execute(sql, all_params)
        # No RETURNING: all or, rarely, some; the caller checks any id not listed.
        return ids if cursor.rowcount == len(ids) else []

    def claim_and_mark(
        self,
        worker_id: str,
        queue: str,
        limit: int,
        succeeded: Sequence[tuple[int, int, str | None]],
    ) -> tuple[list[ClaimedJob], list[int]]:
        """Write success marks and claim new jobs; with :attr:`mark_in_claim_transaction`
        both happen in one transaction (one commit)."""
        if self.mark_in_claim_transaction and succeeded and limit:
            with self.write_transaction() as cursor:
                written = self._mark_succeeded(cursor, worker_id, succeeded)
                return self._claim(cursor, worker_id, queue, limit), written
        written = self.mark_succeeded(worker_id, succeeded) if succeeded else []
        return self.claim(worker_id, queue, limit) if limit else [], written

    #: Whether success marks share the claim's transaction (where a commit is costly).
    mark_in_claim_transaction = False

    def _claim(self, cursor: Any, worker_id: str, queue: str, limit: int) -> list[ClaimedJob]:
        """The claim on an open cursor, for engines that set mark_in_claim_transaction."""
        raise NotImplementedError

    def mark_succeeded_and_insert(
        self, worker_id: str, done: tuple[int, int, str | None], rows: Sequence[InsertRow]
    ) -> bool:
        """Mark one claim succeeded and, only if that write landed, insert ``rows`` (the next
        step of a chain) in the same transaction."""
        with self.write_transaction() as cursor:
            written = bool(self._mark_succeeded(cursor, worker_id, [done]))
            if written and rows:
                self.insert_jobs(rows, notify={row.queue for row in rows})
        return written

    def mark_failed_and_insert(
        self,
        worker_id: str,
        job_id: int,
        attempts: int,
        failure: Failure,
        rows: Sequence[InsertRow],
    ) -> bool:
        """mark_failed(), plus ``rows`` (a chain's error handler) in the same transaction."""
        with self.write_transaction():
            written = self.mark_failed(worker_id, job_id, attempts, failure)
            if written and rows:
                self.insert_jobs(rows, notify={row.queue for row in rows})
        return written

    def mark_failed(self, worker_id: str, job_id: int, attempts: int, failure: Failure) -> bool:
        sql = (
            f"UPDATE {self.job_table} SET state = %s, "
            f"next_execution_at = COALESCE(%s, next_execution_at), queue = %s, "
            f"finished_at = CASE WHEN %s THEN {self.now_sql} ELSE NULL END, "
            f"errors = {self.json_append_sql('errors')}, last_error = %s "
            f"WHERE {self.CLAIM_MATCH}"
        )
        params = [
            "dead" if failure.dead else "failed",
            self.adapt_dt(failure.retry_at),
            failure.queue,
            failure.dead,
            failure.error,
            failure.last_error,
            job_id,
            attempts,
            worker_id,
        ]
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return bool(cursor.rowcount == 1)

    def release(self, worker_id: str, claims: Sequence[tuple[int, int]]) -> list[int]:
        """Give claims back to ``waiting`` without charging the attempt; returns ids written."""
        written: list[int] = []
        sql = (
            f"UPDATE {self.job_table} SET state = 'waiting', attempts = attempts - 1, "
            "started_at = CASE WHEN attempts <= 1 THEN NULL ELSE started_at END "
            f"WHERE {self.CLAIM_MATCH}"
        )
        with self.write_transaction() as cursor:
            for job_id, attempts in claims:
                cursor.execute(sql, [job_id, attempts, worker_id])
                if cursor.rowcount == 1:
                    written.append(job_id)
        return written

    def claim_state(self, job_id: int) -> tuple[str, int, str | None] | None:
        """(state, attempts, reserved_by) of a row, to explain a compare-and-set that missed."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT state, attempts, reserved_by FROM {self.job_table} WHERE id = %s",
                [job_id],
            )
            row = cursor.fetchone()
        return None if row is None else (row[0], row[1], row[2])

    # -- workers, heartbeats and rescue ---------------------------------------------------
    def register_worker(
        self, worker_id: str, hostname: str, pid: int, queues: str, concurrency: int
    ) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {self.worker_table} (id, hostname, pid, queues, concurrency, "
                f"started_at, heartbeat_at) VALUES (%s, %s, %s, %s, %s, {self.now_sql}, "
                f"{self.now_sql})",
                [worker_id, hostname, pid, queues, concurrency],
            )

    def heartbeat(self, worker_id: str) -> bool:
        """Refresh the worker's heartbeat; False if its row is gone (it was declared lost)."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {self.worker_table} SET heartbeat_at = {self.now_sql} WHERE id = %s",
                [worker_id],
            )
            return bool(cursor.rowcount == 1)

    def unregister_worker(self, worker_id: str) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {self.worker_table} WHERE id = %s", [worker_id])

    def lost_claims(self, cutoff: datetime) -> list[tuple[int, int, str, int]]:
        """Running jobs whose worker has no heartbeat since ``cutoff``:
        (id, attempts, reserved_by, rescues)."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT j.id, j.attempts, j.reserved_by, j.rescues FROM {self.job_table} j "
                f"WHERE j.state = 'running' AND NOT EXISTS (SELECT 1 FROM {self.worker_table} w "
                "WHERE w.id = j.reserved_by AND w.heartbeat_at >= %s)",
                [self.adapt_dt(cutoff)],
            )
            return [(r[0], r[1], r[2], r[3]) for r in cursor.fetchall()]

    def rescue(
        self,
        job_id: int,
        attempts: int,
        owner: str,
        cutoff: datetime,
        *,
        dead: bool,
        error: str,
        last_error: str,
    ) -> bool:
        """Take a job back from a lost worker: ``waiting`` again, or ``dead`` as a poison pill.

        The owner's heartbeat is checked again in the same statement, so a worker that comes
        back between our read and this write keeps its job.
        """
        sql = (
            f"UPDATE {self.job_table} SET state = %s, rescues = rescues + 1, "
            f"next_execution_at = {self.now_sql}, "
            f"finished_at = CASE WHEN %s THEN {self.now_sql} ELSE NULL END, "
            f"errors = {self.json_append_sql('errors')}, last_error = %s "
            f"WHERE {self.CLAIM_MATCH} AND NOT EXISTS (SELECT 1 FROM {self.worker_table} w "
            "WHERE w.id = %s AND w.heartbeat_at >= %s)"
        )
        params = [
            "dead" if dead else "waiting",
            dead,
            error,
            last_error,
            job_id,
            attempts,
            owner,
            owner,
            self.adapt_dt(cutoff),
        ]
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return bool(cursor.rowcount == 1)

    def forget_workers(self, cutoff: datetime) -> int:
        """Delete worker rows whose heartbeat lapsed before ``cutoff``."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {self.worker_table} WHERE heartbeat_at < %s",
                [self.adapt_dt(cutoff)],
            )
            return int(cursor.rowcount)
