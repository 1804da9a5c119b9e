"""The engine contract and the SQL shared by every database.

Every write after a claim is a compare-and-set on the claim: ``id`` + ``state = 'running'``
+ ``attempts`` + ``reserved_by``. Zero rows changed means the job is no longer ours (it was
rescued, re-claimed or changed by an operator): the caller logs it and writes nothing else.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, transaction
from django.utils.dateparse import parse_datetime

from django_gator import jsonsql
from django_gator.models import Job, Worker
from django_gator.rows import ClaimedJob, Failure, InsertRow, LostClaim

if TYPE_CHECKING:
    from django_gator.worker.connections import NetworkBounds

READY_SQL = "state IN ('waiting', 'failed')"
JOB_COLUMNS = (
    "id, name, args, kwargs, queue, priority, attempts, rescues, chain_id, chain_position, chain, "
    "next_execution_at, created_at, suspect"
)


#: What runs on each connection an engine opens itself, outside Django's: see
#: set_connection_hook().
ConnectionHook = Callable[["Engine", Any], None]
_connection_hook: ConnectionHook | None = None


def set_connection_hook(hook: ConnectionHook | None) -> None:
    """Install what is done with each driver connection an engine opens outside Django's
    (PostgreSQL's LISTEN connection) before its first statement: a worker process bounds its
    silence as it does its other connections (worker.connections.bound_connection). The
    engines sit below the worker and do not import it; the app's ready() installs it."""
    global _connection_hook
    _connection_hook = hook


@dataclass(frozen=True, slots=True)
class Position:
    """Where a keyset claim starts reading one queue (engines with ``supports_keyset``).

    ``after`` maps a priority to the (next_execution_at, id) of the last job claimed at
    that priority: the claim reads that priority's range of the ready index from just after
    it, so it never steps over the entries of the jobs claimed before (entries that a long
    transaction keeps from being cleaned up). Priorities not in ``after`` are read from the
    start of their range. ``lookback``: a priority's range is read from no later than this
    many seconds before the database's now, so a job whose transaction committed after a
    later job was claimed (its next_execution_at is its INSERT's time) is still seen."""

    after: Mapping[int, tuple[Any, int]]
    lookback: float = 0.0


_ROW_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def error_class_of(summary: str) -> str:
    """The exception class of a ``last_error`` summary ("Class: message" or "Class")."""
    return summary.split(":", 1)[0].strip()[:255]


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

    def atomic_job(self) -> AbstractContextManager[Any]:
        """The transaction of an atomic job's handle() and success mark, as the worker
        opens it."""
        return transaction.atomic(using=self.alias)

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

    def opened_own_connection(self, raw: Any) -> None:
        """``raw``, a driver connection this engine opened itself, is about to be used: hand
        it to the installed hook (see set_connection_hook())."""
        hook = _connection_hook
        if hook is not None:
            hook(self, raw)

    def prepare_bookkeeping(self) -> None:
        """Tune this thread's connection for the worker's own writes (claims, outcome
        marks, heartbeats); called before each use, cheap when nothing changed."""

    def prepare_worker_session(self, raw: Any, bounds: NetworkBounds) -> None:
        """Have the server give up this worker connection's session, and its transaction
        and locks with it, after ``bounds`` of silence from the worker (a partition).
        ``raw`` is the driver's connection, just opened, in autocommit; called once for each
        connection of a worker process (see worker.connections)."""

    def db_now(self) -> datetime:
        with self.connection.cursor() as cursor:
            cursor.execute(f"SELECT {self.now_sql}", [])
            return self.to_dt(cursor.fetchone()[0])

    def json_append_sql(self, column: str) -> str:
        """SQL that appends the JSON parameter ``%s`` to the array in ``column``."""
        return jsonsql.append_sql(self.vendor, column)

    #: SQL for "database now plus ``%s`` seconds" (NULL when the parameter is NULL).
    later_sql = ""

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
        chain_position, chain, unique_key]`` rows, each array under :attr:`insert_bytes`."""
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
                    row.unique_key,
                ]
            )
            if parts and size + len(part) > self.insert_bytes:
                documents.append("[" + ",".join(parts) + "]")
                parts, size = [], 0
            parts.append(part)
            size += len(part) + 1
        documents.append("[" + ",".join(parts) + "]")
        return documents

    # -- unique jobs ---------------------------------------------------------------------
    #: Matches the active row of (name, unique_key) through the database's unique index.
    unique_match_sql = "name = %s AND unique_key = %s AND state IN ('waiting', 'failed', 'running')"
    #: Inserts tried per row before a dispatch of a unique job gives up.
    UNIQUE_TRIES = 10

    def insert_unique(
        self, rows: Sequence[InsertRow], notify: set[str] | None = None
    ) -> list[tuple[int, datetime, datetime, bool]]:
        """Insert rows that carry a ``unique_key``; a row whose key already has a waiting,
        failed or running job is not inserted, and that job's (id, created_at,
        next_execution_at) comes back instead. The fourth item is True for a new row.

        The database's unique index decides: a concurrent dispatch of the same key either
        commits first (our INSERT fails inside a savepoint and we read its row) or waits for
        ours. Rows go one at a time, each in its own savepoint, all in one transaction.
        """
        out: list[tuple[int, datetime, datetime, bool]] = []
        seen: dict[tuple[str, str | None], tuple[int, datetime, datetime]] = {}
        with transaction.atomic(using=self.alias):
            for row in rows:
                key = (row.name, row.unique_key)
                if key in seen:
                    out.append((*seen[key], False))
                    continue
                job_id, created_at, next_at, created = self._insert_or_find(row, notify)
                seen[key] = (job_id, created_at, next_at)
                out.append((job_id, created_at, next_at, created))
        return out

    def _insert_or_find(
        self, row: InsertRow, notify: set[str] | None
    ) -> tuple[int, datetime, datetime, bool]:
        error: IntegrityError | None = None
        for _ in range(self.UNIQUE_TRIES):
            existing = self.find_unique(row.name, row.unique_key)
            if existing is not None:
                return (*existing, False)
            try:
                with transaction.atomic(using=self.alias):
                    wake = {row.queue} if row.run_at is None and notify else None
                    [inserted] = self.insert_jobs([row], notify=wake)
            except IntegrityError as exc:
                error = exc  # another dispatch took the key since our look: read its row
                continue
            return (*inserted, True)
        raise IntegrityError(
            f"could not insert or find the job {row.name!r} with unique key "
            f"{row.unique_key!r} after {self.UNIQUE_TRIES} tries: {error}"
        )

    def is_deadlock(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the database ended the transaction to break a deadlock, so
        that running it again from the start can succeed."""
        return False

    def unique_lookup_lock(self) -> str:
        """Appended to the lookup of an active unique row when a plain read could miss the
        newest commit (a snapshot taken earlier in the transaction); empty by default."""
        return ""

    def find_unique(self, name: str, key: str | None) -> tuple[int, datetime, datetime] | None:
        """(id, created_at, next_execution_at) of the active job holding ``key``, if any."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id, created_at, next_execution_at FROM {self.job_table} "
                f"WHERE {self.unique_match_sql}{self.unique_lookup_lock()}",
                [name, key],
            )
            row = cursor.fetchone()
        return None if row is None else (row[0], self.to_dt(row[1]), self.to_dt(row[2]))

    @contextmanager
    def listen(self) -> Iterator[Listener]:
        raise NotImplementedError(f"{self.vendor} has no LISTEN; workers poll")
        yield  # pragma: no cover

    # -- claim -----------------------------------------------------------------------------
    def claim(
        self, worker_id: str, queue: str, limit: int, after: Position | None = None
    ) -> list[ClaimedJob]:
        """Atomically take up to ``limit`` due jobs of ``queue`` for ``worker_id``, highest
        priority first, then by next_execution_at and id.

        ``after`` (engines with :attr:`supports_keyset`): a keyset claim, which reads each
        priority from the :class:`Position` given instead of from the start of the index
        (a job placed before it is not seen). Other engines ignore it."""
        raise NotImplementedError

    #: Whether claim() honours ``after`` and ready_queues() ``known`` (see there).
    supports_keyset = False

    def ready_queues(self, known: Sequence[str] = ()) -> list[str]:
        """Names of the queues that hold waiting or failed jobs (a skip scan of the index).

        ``known`` (engines with :attr:`supports_keyset`): queues the caller claims from
        anyway; they are neither read nor returned, so their index entries (live, or dead
        ones that a long transaction keeps) are not stepped over. Other engines ignore it.
        """
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
            next_execution_at=row[11] if len(row) > 11 else None,
            created_at=row[12] if len(row) > 12 else None,
            suspect=bool(row[13]) if len(row) > 13 else False,
        )

    # -- outcomes (compare-and-set on the claim) ----------------------------------------
    #: The jobs table as the target of compare-and-set writes (engines may add an index
    #: hint there; see guard()).
    cas_table_sql = ""

    def guard(self, condition: str) -> str:
        """``condition`` AND "still running, and still ours": the check of every
        compare-and-set on a claim. It adds one ``%s``, the worker id, after the
        parameters of ``condition``.

        Engines phrase it (or hint the table) so that the row is found by its primary key,
        never through the partial index of running jobs or the (state, finished_at) index:
        those keep an entry for every job a worker ever ran until vacuum removes it, all
        under the same owner, so a lookup through them would cost more with every job."""
        return f"{condition} AND state = 'running' AND reserved_by = %s"

    @property
    def claim_match(self) -> str:
        """One claim: ``id``, ``attempts`` and the worker id, as three parameters."""
        return f"id = %s AND {self.guard('attempts = %s')}"

    @property
    def cas_table(self) -> str:
        return self.cas_table_sql or self.job_table

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
            f"UPDATE {self.cas_table} SET state = 'succeeded', finished_at = {self.now_sql}, "
            f"result = {result_sql} WHERE id IN ({', '.join(['%s'] * len(ids))}) "
            f"AND {self.guard(f'attempts = {attempts_case}')}"
        )
        all_params = [*result_params, *ids, *params, worker_id]
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
        after: Position | None = None,
    ) -> tuple[list[ClaimedJob], list[int]]:
        """Write success marks and claim new jobs; with :attr:`mark_in_claim_transaction`
        both happen in one transaction (one commit)."""
        if self.mark_in_claim_transaction and succeeded and limit:
            with self.write_transaction() as cursor:
                written = self._mark_succeeded(cursor, worker_id, succeeded)
                return self._claim(cursor, worker_id, queue, limit), written
        written = self.mark_succeeded(worker_id, succeeded) if succeeded else []
        return self.claim(worker_id, queue, limit, after) if limit else [], written

    #: Whether success marks share the claim's transaction (where a commit is costly).
    mark_in_claim_transaction = False

    def _claim(self, cursor: Any, worker_id: str, queue: str, limit: int) -> list[ClaimedJob]:
        """The claim on an open cursor, for engines that set mark_in_claim_transaction."""
        raise NotImplementedError

    def mark_succeeded_and_insert(
        self,
        worker_id: str,
        done: tuple[int, int, str | None],
        rows: Sequence[InsertRow],
        inserted: list[int] | None = None,
    ) -> bool:
        """Mark one claim succeeded and, only if that write landed, insert ``rows`` (the next
        step of a chain) in the same transaction; their ids are added to ``inserted``."""
        with self.write_transaction() as cursor:
            written = bool(self._mark_succeeded(cursor, worker_id, [done]))
            if written and rows:
                ids = self.insert_jobs(rows, notify={row.queue for row in rows})
                if inserted is not None:
                    inserted += [r[0] for r in ids]
        return written

    def mark_failed_and_insert(
        self,
        worker_id: str,
        job_id: int,
        attempts: int,
        failure: Failure,
        rows: Sequence[InsertRow],
        inserted: list[int] | None = None,
    ) -> bool:
        """mark_failed(), plus ``rows`` (a chain's error handler) in the same transaction;
        their ids are added to ``inserted``."""
        with self.write_transaction():
            written = self.mark_failed(worker_id, job_id, attempts, failure)
            if written and rows:
                ids = self.insert_jobs(rows, notify={row.queue for row in rows})
                if inserted is not None:
                    inserted += [r[0] for r in ids]
        return written

    def claim_by_id(self, worker_id: str, job_id: int) -> ClaimedJob | None:
        """Claim one waiting or failed job by id, due or not (run_jobs() and GATOR_IMMEDIATE
        choose which job to run themselves); None if it is not claimable."""
        with self.write_transaction() as cursor:
            cursor.execute(
                f"UPDATE {self.job_table} SET state = 'running', attempts = attempts + 1, "
                f"reserved_by = %s, locked_at = {self.now_sql}, isolated = FALSE, "
                f"started_at = COALESCE(started_at, {self.now_sql}) "
                f"WHERE id = %s AND {READY_SQL}",
                [worker_id, job_id],
            )
            if cursor.rowcount != 1:
                return None
            cursor.execute(f"SELECT {JOB_COLUMNS} FROM {self.job_table} WHERE id = %s", [job_id])
            return self.claimed(cursor.fetchone())

    def mark_failed(self, worker_id: str, job_id: int, attempts: int, failure: Failure) -> bool:
        # A job whose cancellation was asked for ends cancelled, whatever its retry policy.
        sql = (
            f"UPDATE {self.cas_table} SET "
            "state = CASE WHEN %s OR cancel_requested THEN 'cancelled' ELSE %s END, "
            f"next_execution_at = COALESCE({self.later_sql}, next_execution_at), queue = %s, "
            f"finished_at = CASE WHEN %s OR cancel_requested THEN {self.now_sql} ELSE NULL END, "
            f"errors = {self.json_append_sql('errors')}, last_error = %s, error_class = %s, "
            # Last: MySQL evaluates SET left to right (the WHERE sees the old value).
            "attempts = attempts - %s "
            f"WHERE {self.claim_match}"
        )
        params = [
            failure.cancelled,
            "dead" if failure.dead else "failed",
            failure.retry_in,
            failure.queue,
            failure.dead or failure.cancelled,
            failure.error,
            failure.last_error,
            error_class_of(failure.last_error),
            1 if failure.uncharged else 0,
            job_id,
            attempts,
            worker_id,
        ]
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return bool(cursor.rowcount == 1)

    def release(self, worker_id: str, claims: Sequence[tuple[int, int]]) -> list[int]:
        """Give claims back to ``waiting`` without charging the attempt (``cancelled`` if
        a cancellation was asked for); returns the ids written."""
        written: list[int] = []
        sql = (
            f"UPDATE {self.cas_table} SET "
            "state = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'waiting' END, "
            f"finished_at = CASE WHEN cancel_requested THEN {self.now_sql} ELSE NULL END, "
            # started_at before attempts: MySQL evaluates SET left to right, later
            # assignments seeing the new values of earlier ones.
            "started_at = CASE WHEN attempts <= 1 THEN NULL ELSE started_at END, "
            "attempts = attempts - 1 "
            f"WHERE {self.claim_match}"
        )
        with self.write_transaction() as cursor:
            for job_id, attempts in claims:
                cursor.execute(sql, [job_id, attempts, worker_id])
                if cursor.rowcount == 1:
                    written.append(job_id)
        return written

    def running_claims(self, worker_id: str) -> list[tuple[int, int]]:
        """(id, attempts) of every job ``worker_id`` holds in ``running``. After a claim
        whose answer was lost, the worker compares this with what it knows it holds."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id, attempts FROM {self.job_table} "
                "WHERE reserved_by = %s AND state = 'running'",
                [worker_id],
            )
            return [(row[0], row[1]) for row in cursor.fetchall()]

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

    #: Whether every worker of the database runs on one host, so that a rescuer can ask
    #: the operating system whether a worker whose heartbeat lapsed is alive (SQLite).
    workers_share_a_host = False

    def shared_memory_file(self) -> str | None:
        """A file that every process using the database has mapped, if there is one."""
        return None

    def lapsed_workers(self, cutoff: datetime) -> list[tuple[str, str, int, datetime]]:
        """(id, hostname, pid, started_at) of the workers with no heartbeat since ``cutoff``."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id, hostname, pid, started_at FROM {self.worker_table} "
                "WHERE heartbeat_at < %s",
                [self.adapt_dt(cutoff)],
            )
            return [(r[0], r[1], r[2], self.to_dt(r[3])) for r in cursor.fetchall()]

    def lost_claims(self, cutoff: datetime, *, sweep: bool = False) -> list[LostClaim]:
        """Running jobs whose worker has no heartbeat since ``cutoff``.

        By default, the jobs of the workers whose row shows a lapsed heartbeat, found by
        owner through the running index: its cost is those workers' entries alone (none
        when every worker is alive), not every job that ever ran. With ``sweep``, every
        running job whose owner has no fresh heartbeat, including owners that have no row
        at all; that reads every running entry, so the worker runs it only now and then."""
        columns = "j.id, j.attempts, j.reserved_by, j.rescues, j.isolated, j.crashes"
        with self.connection.cursor() as cursor:
            if sweep:
                cursor.execute(
                    f"SELECT {columns} FROM {self.job_table} j "
                    "WHERE j.state = 'running' AND NOT EXISTS (SELECT 1 FROM "
                    f"{self.worker_table} w WHERE w.id = j.reserved_by AND w.heartbeat_at >= %s)",
                    [self.adapt_dt(cutoff)],
                )
            else:
                cursor.execute(
                    f"SELECT id FROM {self.worker_table} WHERE heartbeat_at < %s",
                    [self.adapt_dt(cutoff)],
                )
                owners = [row[0] for row in cursor.fetchall()]
                if not owners:
                    return []
                cursor.execute(
                    f"SELECT {columns} FROM {self.job_table} j WHERE j.state = 'running' "
                    f"AND j.reserved_by IN ({', '.join(['%s'] * len(owners))})",
                    owners,
                )
            return [LostClaim(r[0], r[1], r[2], r[3], bool(r[4]), r[5]) for r in cursor.fetchall()]

    def isolate(self, worker_id: str, job_id: int, attempts: int) -> bool:
        """Record that this attempt of a claimed job runs alone in its worker (a suspect's
        test run), so that losing the worker now is blamed on the job."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {self.cas_table} SET isolated = TRUE WHERE {self.claim_match}",
                [job_id, attempts, worker_id],
            )
            return bool(cursor.rowcount == 1)

    def rescue(
        self,
        lost: LostClaim,
        cutoff: datetime,
        *,
        dead: bool,
        error: str,
        last_error: str,
    ) -> bool:
        """Take a job back from a lost worker: ``waiting`` again (now a suspect, which runs
        alone), ``dead`` as a poison pill, or ``cancelled`` if a cancellation was asked
        for. A crash counts against the job (``crashes``) only if the lost attempt ran
        alone.

        The owner's heartbeat is checked again in the same statement, so a worker that comes
        back between our read and this write keeps its job; so is ``isolated``, so the
        blame written is the one that was read.
        """
        sql = (
            f"UPDATE {self.cas_table} SET "
            "state = CASE WHEN cancel_requested THEN 'cancelled' ELSE %s END, "
            f"rescues = rescues + 1, next_execution_at = {self.now_sql}, "
            f"finished_at = CASE WHEN %s OR cancel_requested THEN {self.now_sql} ELSE NULL END, "
            f"errors = {self.json_append_sql('errors')}, last_error = %s, error_class = %s, "
            # Last, for MySQL's left-to-right SET: the WHERE reads the old values.
            "crashes = crashes + %s, suspect = TRUE, isolated = FALSE "
            f"WHERE {self.claim_match} AND isolated = %s AND NOT EXISTS (SELECT 1 FROM "
            f"{self.worker_table} w WHERE w.id = %s AND w.heartbeat_at >= %s)"
        )
        params = [
            "dead" if dead else "waiting",
            dead,
            error,
            last_error,
            error_class_of(last_error),
            1 if lost.isolated else 0,
            lost.id,
            lost.attempts,
            lost.owner,
            lost.isolated,
            lost.owner,
            self.adapt_dt(cutoff),
        ]
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return bool(cursor.rowcount == 1)

    def forget_workers(self, cutoff: datetime, only: Sequence[str] | None = None) -> int:
        """Delete worker rows whose heartbeat lapsed before ``cutoff`` (of those, only the
        ids in ``only``, if given)."""
        ids = f" AND id IN ({', '.join(['%s'] * len(only))})" if only else ""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {self.worker_table} WHERE heartbeat_at < %s{ids}",
                [self.adapt_dt(cutoff), *(only or ())],
            )
            return int(cursor.rowcount)
