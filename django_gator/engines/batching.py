"""Batch statements: settling a batch in the transaction of its members' outcomes.

Every write that can end a member (a success mark, batched or not; a failure to dead; a
cancellation; a rescue to dead) settles the member's batch before its transaction
commits: it locks the batch's row, asks whether any member is still active, and if the
batch is closed and none is, dispatches ``on_complete`` (and ``on_success`` when every
member succeeded) and records the completion on the row; ``on_dead`` is dispatched the
first time a member is seen dead. The callbacks' rows commit with the outcome, or not at
all, so a crash anywhere neither loses them nor writes them twice.

Why this is exactly once with concurrent last members: the batch row's lock orders the
settling transactions of one batch. Each takes it after writing its own members and
holds it to its commit, so the last to take it sees every other member's outcome (they
committed before releasing the lock), provided its check reads the newest committed rows:
PostgreSQL's READ COMMITTED gives each statement a fresh snapshot, SQLite has one writer at
a time, and on MariaDB/MySQL (REPEATABLE READ) each look at the members is a locking read
with NOWAIT (see :meth:`BatchStatements._member_in`), as a plain read there may see a
snapshot taken before the lock. The row's ``completed_generation``, written under the
lock, keeps a completion from being answered twice.

A batch that is a workflow's step has no callbacks: the step is settled by
:mod:`django_gator.models.settling`, which reads the members through :meth:`probe_batch`
under the same lock.

The cost: one primary-key lock per batch per outcome transaction; a worker's batched
success marks settle each batch once for the whole batch of marks.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from django.db import connections

from django_gator.engines.dispatching import DispatchStatements
from django_gator.exceptions import JobNotRegistered
from django_gator.models import Batch
from django_gator.models.membership import LOCKED, Probe
from django_gator.registry import get_job_class
from django_gator.rows import InsertRow
from django_gator.states import ACTIVE_STATES, SQL_CANCELLED, SQL_DEAD, sql_list

#: State conditions of _member_in().
ACTIVE = f"IN {sql_list(ACTIVE_STATES)}"
DEAD = f"= {SQL_DEAD}"
ENDED_BADLY = f"IN ({SQL_DEAD}, {SQL_CANCELLED})"
#: What _member_in() answers when it has not seen such a member for sure.
NOT_SEEN = (None, LOCKED)

_COLUMNS = (
    "closed, generation, completed_generation, success_dispatched, dead_dispatched, "
    "on_success, on_complete, on_dead"
)


class BatchStatements(DispatchStatements):
    """Settling and re-opening batches (see the module's docstring)."""

    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        self.batch_table = connections[alias].ops.quote_name(Batch._meta.db_table)

    #: Appended to the SELECT that locks a batch row (SQLite: the write lock is the lock).
    _row_lock_sql = " FOR UPDATE"

    def _settle_batches(
        self, cursor: Any, batch_ids: Collection[int], inserted: list[int] | None = None
    ) -> None:
        """In the open transaction of ``cursor``, after members of ``batch_ids`` changed:
        dispatch the callbacks that are now due, once; their ids are added to
        ``inserted``."""
        for batch_id in sorted(batch_ids):
            self._settle(cursor, batch_id, inserted)

    def _settle(self, cursor: Any, batch_id: int, inserted: list[int] | None = None) -> None:
        cursor.execute(
            f"SELECT {_COLUMNS} FROM {self.batch_table} WHERE id = %s{self._row_lock_sql}",
            [batch_id],
        )
        row = cursor.fetchone()
        if row is None:
            return
        closed, generation, completed, success_done, dead_done, on_success, on_complete, on_dead = (
            row
        )
        callbacks: list[str] = []
        changes: list[str] = []
        if on_dead and not dead_done and self._member_in(cursor, batch_id, DEAD) not in NOT_SEEN:
            # (A member seen LOCKED is being changed; its own settling follows ours.)
            callbacks.append(on_dead)
            changes.append("dead_dispatched = TRUE")
        if closed and completed < generation and not self._has_active_members(cursor, batch_id):
            if on_complete:
                callbacks.append(on_complete)
            if (
                on_success
                and not success_done
                and self._member_in(cursor, batch_id, ENDED_BADLY) is None
            ):
                callbacks.append(on_success)
                changes.append("success_dispatched = TRUE")
            changes += [
                f"completed_generation = {int(generation)}",
                f"completed_at = {self.now_sql}",
            ]
        if not changes and not callbacks:
            return
        if changes:
            cursor.execute(
                f"UPDATE {self.batch_table} SET {', '.join(changes)} WHERE id = %s", [batch_id]
            )
        if callbacks:
            rows = [_callback_row(name, batch_id) for name in callbacks]
            ids = self.insert_jobs(rows, notify={r.queue for r in rows})
            if inserted is not None:
                inserted += [r[0] for r in ids]

    def _member_in(self, cursor: Any, batch_id: int, state_sql: str) -> int | None:
        """The id of a member of ``batch_id`` whose state is ``state_sql`` (``= 'dead'``,
        ``IN (...)``) as of the newest commit (the batch row is locked by this
        transaction), or None. Engines whose reads may see an older snapshot answer
        LOCKED for a member that another transaction is changing."""
        cursor.execute(
            f"SELECT id FROM {self.job_table} WHERE batch_id = %s AND state {state_sql} LIMIT 1",
            [batch_id],
        )
        row = cursor.fetchone()
        return None if row is None else int(row[0])

    def _has_active_members(self, cursor: Any, batch_id: int) -> bool:
        """Whether a member of ``batch_id`` is waiting, failed or running (or being changed
        by another transaction, which settles the batch after ours)."""
        return self._member_in(cursor, batch_id, ACTIVE) is not None

    def probe_batch(self, batch_id: int) -> Probe | None:
        """Lock the row of ``batch_id`` and read what its workflow step needs (see
        :class:`~django_gator.models.membership.Probe`), in the open transaction; None if
        the row is gone."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT closed FROM {self.batch_table} WHERE id = %s{self._row_lock_sql}",
                [batch_id],
            )
            row = cursor.fetchone()
            if row is None:
                return None
            active, dead, cancelled = self._probe_members(cursor, batch_id)
            return Probe(closed=bool(row[0]), active=active, dead=dead, cancelled=cancelled)

    def _probe_members(self, cursor: Any, batch_id: int) -> tuple[bool, int | None, int | None]:
        """(a member is active, a dead member's id, a cancelled member's id) of the locked
        batch ``batch_id``, as of the newest commit: one statement, run after the one that
        took the lock (so its snapshot sees the commit of the lock's previous holder)."""
        looks = [
            f"(SELECT id FROM {self.job_table} WHERE batch_id = %s AND state {state} LIMIT 1)"
            for state in (ACTIVE, DEAD, f"= {SQL_CANCELLED}")
        ]
        cursor.execute(f"SELECT {', '.join(looks)}", [batch_id] * len(looks))
        active, dead, cancelled = cursor.fetchone()
        return active is not None, dead, cancelled

    def _after_rescue(self, cursor: Any, job_id: int) -> None:
        """Settle the batch of job ``job_id`` (a rescue knows only the job)."""
        cursor.execute(f"SELECT batch_id FROM {self.job_table} WHERE id = %s", [job_id])
        row = cursor.fetchone()
        if row is not None and row[0] is not None:
            self._settle(cursor, row[0])

    def reopen_batches(self, batch_ids: Collection[int]) -> None:
        """Lock ``batch_ids`` (in id order) and start a new generation of each completed
        one: dead members are about to run again, and the batch's next completion is a new
        one. In the caller's open transaction."""
        with self.connection.cursor() as cursor:
            for batch_id in sorted(batch_ids):
                cursor.execute(
                    f"SELECT id FROM {self.batch_table} WHERE id = %s{self._row_lock_sql}",
                    [batch_id],
                )
                cursor.execute(
                    f"UPDATE {self.batch_table} SET generation = generation + 1, "
                    "completed_at = NULL WHERE id = %s AND completed_generation = generation",
                    [batch_id],
                )

    def settle_now(self, batch_ids: Collection[int]) -> list[int]:
        """_settle_batches() on this engine's connection, in the caller's transaction;
        returns the ids of the callbacks it dispatched."""
        inserted: list[int] = []
        with self.connection.cursor() as cursor:
            self._settle_batches(cursor, batch_ids, inserted)
        return inserted


def _callback_row(name: str, batch_id: int) -> InsertRow:
    """A callback's row: the batch id its only argument, the job class's queue and
    priority (a name no longer registered still gets its row, and ends dead saying so)."""
    try:
        job_class = get_job_class(name)
        queue, priority = job_class.queue, job_class.priority
    except JobNotRegistered:
        queue, priority = "default", 0
    return InsertRow(
        name=name,
        args=json.dumps([batch_id]),
        kwargs="{}",
        queue=queue,
        priority=priority,
        run_at=None,
    )
