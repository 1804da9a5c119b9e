"""The engine contract, and the claim and outcome SQL shared by every database.

:class:`Engine` gathers the statements: the plumbing and the compare-and-set guard
(:mod:`.core`), dispatch's INSERTs (:mod:`.dispatching`), worker rows and rescue
(:mod:`.workers`), and here the claims and the outcome writes. Each database's engine
subclasses it (:mod:`.postgresql`, :mod:`.mysql`, :mod:`.sqlite`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django_gator.attempts import Claim, Failure, Mark, batches_of
from django_gator.engines.batching import BatchStatements
from django_gator.engines.core import (
    JOB_COLUMNS,
    KEYED_SQL,
    UNKEYED_SQL,
    Listener,
    Position,
    error_class_of,
    loads,
    set_connection_hook,
)
from django_gator.engines.dedupe import DedupeStatements
from django_gator.engines.gauges import GaugeStatements, QueueGauge
from django_gator.engines.progress import ProgressStatements
from django_gator.engines.workers import WorkerStatements
from django_gator.engines.workflows import WorkflowStatements
from django_gator.rows import ClaimedJob, InsertRow, LostClaim
from django_gator.states import (
    READY_SQL,
    RUNNING_SQL,
    SQL_CANCELLED,
    SQL_SUCCEEDED,
    SQL_WAITING,
    JobState,
    claim_set_sql,
    live_sql,
)

__all__ = [
    "JOB_COLUMNS",
    "KEYED_SQL",
    "UNKEYED_SQL",
    "ClaimedJob",
    "Engine",
    "InsertRow",
    "Listener",
    "LostClaim",
    "Position",
    "QueueGauge",
    "error_class_of",
    "loads",
    "set_connection_hook",
]


class Engine(
    WorkflowStatements,
    BatchStatements,
    DedupeStatements,
    WorkerStatements,
    GaugeStatements,
    ProgressStatements,
):
    """What the package asks of a database: dispatch, claims, outcomes, worker rows,
    workflows and batches."""

    @contextmanager
    def listen(self) -> Iterator[Listener]:
        raise NotImplementedError(f"{self.vendor} has no LISTEN; workers poll")
        yield  # pragma: no cover

    @contextmanager
    def listen_ends(self) -> Iterator[Listener]:
        raise NotImplementedError(f"{self.vendor} has no LISTEN; waiters read")
        yield  # pragma: no cover

    def flag_awaited(self, job_id: int) -> str | None:
        raise NotImplementedError(f"{self.vendor} has no LISTEN; waiters read")

    def flag_awaited_run(self, run_id: Any) -> None:
        raise NotImplementedError(f"{self.vendor} has no LISTEN; waiters read")

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
        """Names of the queues that hold waiting or failed jobs (a skip scan of the index),
        except paused ones.

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
            f") SELECT queue FROM q WHERE queue IS NOT NULL AND {self.unpaused_sql('q.queue')}"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [])
            return [row[0] for row in cursor.fetchall()]

    def ready_condition(self) -> str:
        """The rows of the ordinary claim's ready index (jobs of limited classes are found
        by the limited claim's own, see engines/flow.py)."""
        return f"{READY_SQL} AND {UNKEYED_SQL}"

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
            batch_id=row[14] if len(row) > 14 else None,
            trace_context=loads(row[15]) if len(row) > 15 else None,
            handbacks=row[16] if len(row) > 16 else 0,
            outages=row[17] if len(row) > 17 else 0,
        )

    def mark_succeeded(self, worker_id: str, done: Sequence[Mark]) -> list[int]:
        """Write success marks, each a compare-and-set on its claim; returns the ids
        written. A batch member's mark carries its batch id, and settles the batch with it."""
        batches = any(d.batch_id is not None for d in done)
        with self.write_transaction() if batches else self.connection.cursor() as cursor:
            return self._mark_succeeded(cursor, worker_id, done)

    #: A JSON value as a query parameter.
    _json_param = "%s"

    #: Whether UPDATE ... RETURNING works (it does not on MySQL and MariaDB).
    update_returning = True

    def _mark_succeeded(
        self,
        cursor: Any,
        worker_id: str,
        done: Sequence[Mark],
        inserted: list[int] | None = None,
    ) -> list[int]:
        """One UPDATE for the whole batch, each row matched on its claim."""
        ids = [d.id for d in done]
        params: list[Any] = []
        attempts_case = "CASE id " + " ".join("WHEN %s THEN %s" for _ in done) + " END"
        for d in done:
            params += [d.id, d.attempts]
        with_result = [d for d in done if d.result is not None]
        if with_result:
            result_sql = (
                "CASE id "
                + " ".join(f"WHEN %s THEN {self._json_param}" for _ in with_result)
                + " ELSE NULL END"
            )
            result_params = [v for d in with_result for v in (d.id, d.result)]
        else:
            result_sql, result_params = "NULL", []
        sql = (
            f"UPDATE {self._cas_table} SET state = {SQL_SUCCEEDED}, finished_at = {self.now_sql}, "
            f"result = {result_sql} WHERE id IN ({', '.join(['%s'] * len(ids))}) "
            f"AND {self._guard(f'attempts = {attempts_case}')}"
        )
        all_params = [*result_params, *ids, *params, worker_id]
        if self.update_returning:
            cursor.execute(sql + " RETURNING id", all_params)
            written = [row[0] for row in cursor.fetchall()]
        else:
            cursor.execute(sql, all_params)
            # No RETURNING: all or, rarely, some; the caller checks any id not listed.
            written = ids if cursor.rowcount == len(ids) else []
        self._settle_batches(cursor, batches_of(done), inserted)
        return written

    def claim_and_mark(
        self,
        worker_id: str,
        queue: str,
        limit: int,
        succeeded: Sequence[Mark],
        after: Position | None = None,
    ) -> tuple[list[ClaimedJob], list[int]]:
        """Write success marks and claim new jobs; with :attr:`_mark_in_claim_transaction`
        both happen in one transaction (one commit)."""
        if self._mark_in_claim_transaction and succeeded and limit:
            with self.write_transaction() as cursor:
                written = self._mark_succeeded(cursor, worker_id, succeeded)
                return self._claim(cursor, worker_id, queue, limit), written
        written = self.mark_succeeded(worker_id, succeeded) if succeeded else []
        return self.claim(worker_id, queue, limit, after) if limit else [], written

    #: Whether success marks share the claim's transaction (where a commit is costly).
    _mark_in_claim_transaction = False

    def _claim(self, cursor: Any, worker_id: str, queue: str, limit: int) -> list[ClaimedJob]:
        """The claim on an open cursor, for engines that set _mark_in_claim_transaction."""
        raise NotImplementedError

    def mark_succeeded_and_insert(
        self,
        worker_id: str,
        done: Mark,
        rows: Sequence[InsertRow],
        inserted: list[int] | None = None,
    ) -> bool:
        """Mark one claim succeeded and, only if that write landed, insert ``rows`` (the next
        step of a chain) in the same transaction; their ids are added to ``inserted``."""
        with self.write_transaction() as cursor:
            written = bool(self._mark_succeeded(cursor, worker_id, [done], inserted))
            if written and rows:
                ids = self.insert_jobs(rows, notify={row.queue for row in rows})
                if inserted is not None:
                    inserted += [r[0] for r in ids]
        return written

    def mark_failed_and_insert(
        self,
        worker_id: str,
        claim: Claim,
        failure: Failure,
        rows: Sequence[InsertRow],
        inserted: list[int] | None = None,
    ) -> bool:
        """mark_failed(), plus ``rows`` (a chain's error handler) in the same transaction;
        their ids are added to ``inserted``. A batch member's batch is settled with it."""
        batch_id = claim.batch_id
        with self.write_transaction() as cursor:
            written = self.mark_failed(worker_id, claim, failure)
            if written and rows:
                ids = self.insert_jobs(rows, notify={row.queue for row in rows})
                if inserted is not None:
                    inserted += [r[0] for r in ids]
            if written and batch_id is not None:
                self._settle_batches(cursor, [batch_id], inserted)
        return written

    def claim_by_id(self, worker_id: str, job_id: int) -> ClaimedJob | None:
        """Claim one waiting or failed job by id, due or not (run_jobs() and GATOR_IMMEDIATE
        choose which job to run themselves); None if it is not claimable."""
        with self.write_transaction() as cursor:
            cursor.execute(
                f"UPDATE {self.job_table} SET {claim_set_sql(self.now_sql)} "
                f"WHERE id = %s AND {READY_SQL} AND {live_sql(self.now_sql)}",
                [worker_id, job_id],
            )
            if cursor.rowcount != 1:
                return None
            cursor.execute(f"SELECT {JOB_COLUMNS} FROM {self.job_table} WHERE id = %s", [job_id])
            return self.claimed(cursor.fetchone())

    def mark_failed(self, worker_id: str, claim: Claim, failure: Failure) -> bool:
        """Write ``failure`` on ``claim`` (a compare-and-set); False if the claim was lost.
        Its batch is not settled here: mark_failed_and_insert() does, in its transaction."""
        # A job whose cancellation was asked for ends cancelled, whatever its retry policy.
        sql = (
            f"UPDATE {self._cas_table} SET "
            f"state = CASE WHEN %s OR cancel_requested THEN {SQL_CANCELLED} ELSE %s END, "
            f"next_execution_at = COALESCE({self.later_sql}, next_execution_at), queue = %s, "
            f"finished_at = CASE WHEN %s OR cancel_requested THEN {self.now_sql} ELSE NULL END, "
            f"errors = {self.json_append_sql('errors')}, last_error = %s, error_class = %s, "
            "outages = outages + %s, "
            "handbacks = handbacks + %s, "
            # Last: MySQL evaluates SET left to right (the WHERE sees the old value).
            "attempts = attempts - %s "
            f"WHERE {self._claim_match}"
        )
        params = [
            failure.cancelled,
            (JobState.DEAD if failure.dead else JobState.FAILED).value,
            failure.retry_in,
            failure.queue,
            failure.dead or failure.cancelled,
            failure.error,
            failure.last_error,
            error_class_of(failure.last_error),
            1 if failure.outage else 0,
            1 if failure.handback else 0,
            1 if failure.uncharged else 0,
            claim.id,
            claim.attempts,
            worker_id,
        ]
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return bool(cursor.rowcount == 1)

    def mark_snoozed(self, worker_id: str, claim: Claim, seconds: float) -> bool:
        """The claimed job raised Snooze: back to ``waiting``, due ``seconds`` from now
        (database time), its attempt given back and its ``snoozes`` counted; errors,
        ``last_error``, queue and retry state untouched. A job whose cancellation was asked
        for ends ``cancelled`` instead (not counted as a snooze), and a batch member's
        batch is settled. False if the claim was lost."""
        sql = (
            f"UPDATE {self._cas_table} SET "
            f"next_execution_at = CASE WHEN cancel_requested THEN next_execution_at "
            f"ELSE {self.later_sql} END, "
            f"finished_at = CASE WHEN cancel_requested THEN {self.now_sql} ELSE NULL END, "
            "snoozes = snoozes + CASE WHEN cancel_requested THEN 0 ELSE 1 END, "
            # Last: MySQL evaluates SET left to right (the WHERE sees the old values).
            f"state = CASE WHEN cancel_requested THEN {SQL_CANCELLED} ELSE {SQL_WAITING} END, "
            "attempts = attempts - 1 "
            f"WHERE {self._claim_match}"
        )
        batch_id = claim.batch_id
        with self.write_transaction() if batch_id else self.connection.cursor() as cursor:
            cursor.execute(sql, [seconds, claim.id, claim.attempts, worker_id])
            written = bool(cursor.rowcount == 1)
            if written and batch_id is not None:
                self._settle_batches(cursor, [batch_id])  # cancelled, if it was asked for
            return written

    def release(
        self, worker_id: str, claims: Sequence[Claim], *, handback: bool = False
    ) -> list[int]:
        """Give claims back to ``waiting`` without charging the attempt
        (``cancelled`` if a cancellation was asked for); returns the ids written. A batch
        member's claim carries its batch id too. ``handback``: the jobs were running when
        their worker stopped, and each row's ``handbacks`` goes up by one in the same
        compare-and-set (a claim that never started is not counted)."""
        written: list[int] = []
        sql = (
            f"UPDATE {self._cas_table} SET "
            f"state = CASE WHEN cancel_requested THEN {SQL_CANCELLED} ELSE {SQL_WAITING} END, "
            f"finished_at = CASE WHEN cancel_requested THEN {self.now_sql} ELSE NULL END, "
            # started_at before attempts: MySQL evaluates SET left to right, later
            # assignments seeing the new values of earlier ones.
            "started_at = CASE WHEN attempts <= 1 THEN NULL ELSE started_at END, "
            "handbacks = handbacks + %s, "
            "attempts = attempts - 1 "
            f"WHERE {self._claim_match}"
        )
        counted = 1 if handback else 0
        with self.write_transaction() as cursor:
            for claim in claims:
                cursor.execute(sql, [counted, claim.id, claim.attempts, worker_id])
                if cursor.rowcount == 1:
                    written.append(claim.id)
            self._settle_batches(cursor, batches_of(claims))
        return written

    def running_claims(self, worker_id: str) -> list[Claim]:
        """The claim of every job ``worker_id`` holds in ``running`` (no batch id). After a claim
        whose answer was lost, the worker compares this with what it knows it holds."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id, attempts FROM {self.job_table} "
                f"WHERE reserved_by = %s AND {RUNNING_SQL}",
                [worker_id],
            )
            return [Claim(row[0], row[1]) for row in cursor.fetchall()]

    def claim_state(self, job_id: int) -> tuple[str, int, str | None] | None:
        """(state, attempts, reserved_by) of a row, to explain a compare-and-set that missed."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT state, attempts, reserved_by FROM {self.job_table} WHERE id = %s",
                [job_id],
            )
            row = cursor.fetchone()
        return None if row is None else (row[0], row[1], row[2])
