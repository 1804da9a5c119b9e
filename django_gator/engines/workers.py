"""Worker rows, heartbeats and rescue: the statements of the lifeline."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django_gator.engines.core import (
    EngineCore,
    error_class_of,
)
from django_gator.rows import LostClaim
from django_gator.states import (
    RUNNING_SQL,
    SQL_CANCELLED,
    JobState,
)


class WorkerStatements(EngineCore):
    """Worker registration, heartbeats, lost claims and their rescue."""

    # -- workers, heartbeats and rescue ---------------------------------------------------
    def register_worker(
        self,
        worker_id: str,
        hostname: str,
        pid: int,
        queues: str,
        concurrency: int,
        *,
        supervisor: str = "",
        wakeup_address: str | None = None,
    ) -> None:
        """Insert the worker's row; ``supervisor`` is the id of the ``--processes``
        supervisor that started it (empty for a worker started on its own)."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {self.worker_table} (id, hostname, pid, queues, concurrency, "
                f"supervisor, started_at, heartbeat_at, wakeup_address) VALUES (%s, %s, %s, %s, "
                f"%s, %s, {self.now_sql}, {self.now_sql}, %s)",
                [worker_id, hostname, pid, queues, concurrency, supervisor, wakeup_address],
            )

    def wakeup_targets(self, cutoff: datetime) -> list[tuple[str, str, str]]:
        """(hostname, queues JSON, wakeup address) of the workers with a wakeup address
        and a heartbeat since ``cutoff``."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT hostname, queues, wakeup_address FROM {self.worker_table} "
                "WHERE wakeup_address IS NOT NULL AND heartbeat_at >= %s",
                [self.adapt_dt(cutoff)],
            )
            return [(r[0], r[1], r[2]) for r in cursor.fetchall()]

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
                    f"WHERE j.{RUNNING_SQL} AND NOT EXISTS (SELECT 1 FROM "
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
                    f"SELECT {columns} FROM {self.job_table} j WHERE j.{RUNNING_SQL} "
                    f"AND j.reserved_by IN ({', '.join(['%s'] * len(owners))})",
                    owners,
                )
            return [LostClaim(r[0], r[1], r[2], r[3], bool(r[4]), r[5]) for r in cursor.fetchall()]

    def isolate(self, worker_id: str, job_id: int, attempts: int) -> bool:
        """Record that this attempt of a claimed job runs alone in its worker (a suspect's
        test run), so that losing the worker now is blamed on the job."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {self._cas_table} SET isolated = TRUE WHERE {self._claim_match}",
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
            f"UPDATE {self._cas_table} SET "
            f"state = CASE WHEN cancel_requested THEN {SQL_CANCELLED} ELSE %s END, "
            f"rescues = rescues + 1, next_execution_at = {self.now_sql}, "
            f"finished_at = CASE WHEN %s OR cancel_requested THEN {self.now_sql} ELSE NULL END, "
            f"errors = {self.json_append_sql('errors')}, last_error = %s, error_class = %s, "
            # Last, for MySQL's left-to-right SET: the WHERE reads the old values.
            "crashes = crashes + %s, suspect = TRUE, isolated = FALSE "
            f"WHERE {self._claim_match} AND isolated = %s AND NOT EXISTS (SELECT 1 FROM "
            f"{self.worker_table} w WHERE w.id = %s AND w.heartbeat_at >= %s)"
        )
        params = [
            (JobState.DEAD if dead else JobState.WAITING).value,
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
        with self.write_transaction() as cursor:
            cursor.execute(sql, params)
            rescued = bool(cursor.rowcount == 1)
            if rescued:
                self._after_rescue(cursor, lost.id)
            return rescued

    def _after_rescue(self, cursor: Any, job_id: int) -> None:
        """In the rescue's transaction: what follows (the job's batch is settled)."""

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
