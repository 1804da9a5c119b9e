"""Windows on a unique key (``unique_for``, ``debounce``, ``throttle``) and expiry: the
statements of :mod:`django_gator.windows` and :mod:`django_gator.expiry`.

The database keeps each window, whatever the number of dispatchers:

- ``unique_for``: the row carries its ``unique_key`` (the unique index of active rows
  settles two concurrent dispatches, as for any unique job) and its ``dedupe_key``. Before
  the INSERT, a look for an active job of the key or one that finished within the window;
  after it, in the same savepoint, the same look for a finished one: a job that ran from
  start to end between our look and our INSERT is found then, and our row is rolled back.
- ``debounce`` and ``throttle``: the row carries only its ``dedupe_key``, under a unique
  index of *waiting* rows (``gator_job_dedupe_waiting``): one waiting job per key, beside
  any running ones. A debounced dispatch first updates the waiting row (arguments, start);
  a throttled one returns it. Only when there is none does it insert, and the index
  refuses a second waiting row (we then look again). A throttled row's start is moved to
  the key's last start plus the window after its INSERT: once our waiting row exists, no
  other row of the key can start before it (any waiting one would have collided with ours,
  and the INSERT waited for a claim in flight), so that read is final.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction

from django_gator.engines.dispatching import DispatchStatements
from django_gator.rows import InsertRow
from django_gator.states import ACTIVE_SQL, FINAL_STATES, READY_STATES, SQL_WAITING, sql_list
from django_gator.windows import Window

#: A row: (id, created_at, next_execution_at, created).
Answer = tuple[int, datetime, datetime, bool]
#: Ids per UPDATE of set_expiry().
EXPIRY_CHUNK = 1000


class _Taken(Exception):
    """The key turned out to be taken after our INSERT: roll its savepoint back."""

    def __init__(self, found: tuple[int, datetime, datetime]) -> None:
        self.found = found


class DedupeStatements(DispatchStatements):
    """Dispatch under a window, and the expiry's writes."""

    def insert_windowed(
        self, rows: Sequence[InsertRow], window: Window, notify: set[str] | None = None
    ) -> list[Answer]:
        """Insert, join or replace each row under ``window`` (see the module's docstring);
        rows of one call with the same key get the same answer. One savepoint per try, all
        in one transaction (the caller's if open)."""
        out: list[Answer] = []
        seen: dict[str | None, Answer] = {}
        with transaction.atomic(using=self.alias):
            for row in rows:
                known = seen.get(row.unique_key)  # a None key is no key: never seen
                if known is not None and window.kind != "debounce":
                    out.append((*known[:3], False))
                    continue
                answer = self._windowed(row, window, notify)
                if row.unique_key is not None:
                    seen[row.unique_key] = answer
                out.append(answer)
        return out

    def _windowed(self, row: InsertRow, window: Window, notify: set[str] | None) -> Answer:
        error: IntegrityError | None = None
        for _ in range(self.UNIQUE_TRIES):
            try:
                if window.kind == "unique_for":
                    return self._kept(row, window.seconds, notify)
                if window.kind == "debounce":
                    return self._debounced(row, window.seconds, notify)
                return self._throttled(row, window.seconds, notify)
            except IntegrityError as exc:
                error = exc  # another dispatch took the key meanwhile: look again
        raise IntegrityError(
            f"could not insert or find the job {row.name!r} with unique key "
            f"{row.unique_key!r} after {self.UNIQUE_TRIES} tries: {error}"
        )

    # -- unique_for ------------------------------------------------------------------------
    def _kept(self, row: InsertRow, seconds: float, notify: set[str] | None) -> Answer:
        found = self._holder(row, seconds)
        if found is not None:
            return (*found, False)
        try:
            with transaction.atomic(using=self.alias):
                job_id = self._insert_keyed(row, notify, active_unique=True)
                found = self._holder(row, seconds, finished_only=True)
                if found is not None:
                    raise _Taken(found)
        except _Taken as taken:
            return (*taken.found, False)
        return (job_id, *self._times(job_id), True)

    def _holder(
        self, row: InsertRow, seconds: float, finished_only: bool = False
    ) -> tuple[int, datetime, datetime] | None:
        """The newest job of the row's key that is active (unless ``finished_only``) or
        finished less than ``seconds`` ago, by database time."""
        finished = f"(state IN {sql_list(FINAL_STATES)} AND finished_at > {self.later_sql})"
        which = finished if finished_only else f"({ACTIVE_SQL} OR {finished})"
        return self._one(
            f"SELECT id, created_at, next_execution_at FROM {self.job_table}"
            f" WHERE name = %s AND dedupe_key = %s AND {which}"
            f" ORDER BY id DESC LIMIT 1{self._unique_lookup_lock()}",
            [row.name, row.unique_key, -seconds],
        )

    # -- debounce ---------------------------------------------------------------------------
    def _debounced(self, row: InsertRow, seconds: float, notify: set[str] | None) -> Answer:
        json = "%s::jsonb" if self.vendor == "postgresql" else "%s"
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {self.job_table} SET args = {json}, kwargs = {json},"
                f" next_execution_at = {self.later_sql}"
                f" WHERE name = %s AND dedupe_key = %s AND state = {SQL_WAITING}",
                [row.args, row.kwargs, seconds, row.name, row.unique_key],
            )
            replaced = cursor.rowcount
        if replaced:
            found = self._waiting(row)
            if found is not None:
                return (*found, False)
        with transaction.atomic(using=self.alias):
            job_id = self._insert_keyed(replace(row, run_at=None), None, later=seconds)
        return (job_id, *self._times(job_id), True)

    # -- throttle ---------------------------------------------------------------------------
    def _throttled(self, row: InsertRow, seconds: float, notify: set[str] | None) -> Answer:
        found = self._waiting(row)
        if found is not None:
            return (*found, False)
        with transaction.atomic(using=self.alias):
            job_id = self._insert_keyed(row, notify)
            last = self._one(
                f"SELECT MAX(started_at) FROM {self.job_table}"
                f" WHERE name = %s AND dedupe_key = %s AND id <> %s{self._unique_lookup_lock()}",
                [row.name, row.unique_key, job_id],
            )
            if last is not None and last[0] is not None:
                not_before = self.to_dt(last[0]) + timedelta(seconds=seconds)
                with self.connection.cursor() as cursor:
                    cursor.execute(
                        f"UPDATE {self.job_table} SET next_execution_at = %s"
                        " WHERE id = %s AND next_execution_at < %s",
                        [self.adapt_dt(not_before), job_id, self.adapt_dt(not_before)],
                    )
        return (job_id, *self._times(job_id), True)

    # -- shared -----------------------------------------------------------------------------
    def _insert_keyed(
        self,
        row: InsertRow,
        notify: set[str] | None,
        later: float | None = None,
        active_unique: bool = False,
    ) -> int:
        """INSERT the row and give it its dedupe key (the unique index of waiting rows
        checks it here); ``later``: its start moved to now + that many seconds.
        ``active_unique`` (``unique_for``): the row keeps its ``unique_key`` too, under the
        unique index of active rows; the others have none (a running job of the key does
        not keep the next one from waiting)."""
        keep = row.unique_key
        plain = row if active_unique else replace(row, unique_key=None)
        wake = {row.queue} if row.run_at is None and later is None and notify else None
        [(job_id, _, _)] = self.insert_jobs([plain], notify=wake)
        start = f", next_execution_at = {self.later_sql}" if later is not None else ""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {self.job_table} SET dedupe_key = %s{start} WHERE id = %s",
                [keep, *([later] if later is not None else []), job_id],
            )
        return job_id

    def _waiting(self, row: InsertRow) -> tuple[int, datetime, datetime] | None:
        return self._one(
            f"SELECT id, created_at, next_execution_at FROM {self.job_table}"
            f" WHERE name = %s AND dedupe_key = %s AND state = {SQL_WAITING}"
            f"{self._unique_lookup_lock()}",
            [row.name, row.unique_key],
        )

    def _times(self, job_id: int) -> tuple[datetime, datetime]:
        found = self._one(
            f"SELECT created_at, next_execution_at FROM {self.job_table} WHERE id = %s",
            [job_id],
        )
        assert found is not None  # our own row, in our transaction
        return self.to_dt(found[0]), self.to_dt(found[1])

    def _one(self, sql: str, params: list[Any]) -> Any:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        if row is None or len(row) != 3:
            return row
        return (row[0], self.to_dt(row[1]), self.to_dt(row[2]))

    # -- expiry -----------------------------------------------------------------------------
    def set_expiry(self, ids: Sequence[int], at: datetime | None, seconds: float | None) -> None:
        """Give the jobs ``ids`` their ``expires_at``: ``at``, or ``seconds`` after now by
        database time. In the caller's transaction (the INSERT's: no worker sees the rows
        before they have it)."""
        value, params = (
            ("%s", [self.adapt_dt(at)]) if at is not None else (self.later_sql, [seconds])
        )
        with self.connection.cursor() as cursor:
            for start in range(0, len(ids), EXPIRY_CHUNK):
                chunk = list(ids[start : start + EXPIRY_CHUNK])
                marks = ", ".join(["%s"] * len(chunk))
                cursor.execute(
                    f"UPDATE {self.job_table} SET expires_at = {value} WHERE id IN ({marks})",
                    [*params, *chunk],
                )

    def expired_ids(self, limit: int) -> list[int]:
        """Up to ``limit`` ids of waiting or failed jobs past their ``expires_at`` (by
        database time), soonest expiry first: the expiry index (gator_job_expiring, on
        MySQL and MariaDB its virtual column)."""
        if self.vendor == "mysql":
            where = f"expiring_at <= {self.now_sql}"
            order = "expiring_at"
        else:
            where = (
                f"state IN {sql_list(READY_STATES)} AND expires_at IS NOT NULL"
                f" AND expires_at <= {self.now_sql}"
            )
            order = "expires_at"
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id FROM {self.job_table} WHERE {where} ORDER BY {order} LIMIT %s",
                [limit],
            )
            return [row[0] for row in cursor.fetchall()]
