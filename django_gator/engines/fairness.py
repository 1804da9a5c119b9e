"""Weighted fair share: the stamps of a fair queue's jobs, given in their INSERT's
transaction, and the upkeep of the counters (see django_gator.fairness, docs/fairness.md).

:class:`FairInserts` sits first in each database's engine class, around every INSERT of
jobs (dispatch, dispatch_many, a batch's add, unique and windowed dispatch, the next steps
of chains and workflows): when rows go to a queue of ``GATOR_FAIRNESS`` it opens a
transaction, lets the engine insert, then stamps the new rows without a concurrency key.
Rows of other queues take the engine's path untouched.

The stamp of a key's jobs: the later of the key's counter and the virtual time of their
priority in the queue (the stamp at the head of the fair claim's order among that
priority's due jobs, or, with none, the highest counter of the queue), plus ``1 / weight``
per job. The counter moves in one upsert, which
takes the key's row lock: concurrent dispatches of one key take turns and never share a
stamp; keys of one dispatch are moved in sorted order, so two dispatches never wait on each
other crosswise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.db import transaction

from django_gator import conf, fairness
from django_gator.engines.base import UNKEYED_SQL, Engine
from django_gator.engines.contract import JobEngine, behind
from django_gator.engines.deadlocks import retrying_deadlocks
from django_gator.models import FairShare
from django_gator.states import ACTIVE_SQL, READY_SQL

if TYPE_CHECKING:
    from datetime import datetime

    from django_gator.rows import Inserted, InsertRow, JobRows
    from django_gator.windows import Window

#: Stamps written per UPDATE where they go as a CASE (SQLite, MySQL).
STAMP_CHUNK = 500
#: Unstamped rows of a fair queue stamped per upkeep round and queue.
STRAY_BATCH = 1000

#: The rows of a fair claim's index (PostgreSQL, SQLite; MySQL: ``fair_rank IS NOT NULL``).
FAIR_SQL = f"{READY_SQL} AND {UNKEYED_SQL} AND fair_order IS NOT NULL"


class FairInserts(Engine):
    """The stamping of fair queues' rows around the engine's INSERTs."""

    #: The greatest of two numbers in this database's SQL.
    greatest = "GREATEST"

    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        self.share_table = self.connection.ops.quote_name(FairShare._meta.db_table)

    # -- around the INSERTs ----------------------------------------------------------------
    def insert_jobs(
        self, rows: Sequence[InsertRow], notify: set[str] | None = None
    ) -> list[tuple[int, datetime, datetime]]:
        if not self._any_fair(rows):
            return super().insert_jobs(rows, notify)
        return retrying_deadlocks(
            self, lambda: self._insert_jobs_stamped(rows, notify), "a fair queue's INSERT"
        )

    def _insert_jobs_stamped(
        self, rows: Sequence[InsertRow], notify: set[str] | None
    ) -> list[tuple[int, datetime, datetime]]:
        with self._stamping(rows) as stamp:
            if stamp is None:
                return super().insert_jobs(rows, notify)
            out = super().insert_jobs(rows, notify)
            stamp([row[0] for row in out])
            return out

    def insert_rows(
        self,
        rows: JobRows,
        notify: set[str] | None = None,
        prepare: Callable[[int], None] | None = None,
        meanwhile: Callable[[Inserted], None] | None = None,
    ) -> Inserted:
        if not self._fair_queue(rows.queue):
            return super().insert_rows(rows, notify, prepare, meanwhile)
        # Concurrent dispatches move the same counters: InnoDB may end one of two such
        # transactions to break a deadlock (its upsert takes gap locks), so a transaction
        # of ours is run again (prepare() and meanwhile() may run twice: both idempotent).
        return retrying_deadlocks(
            self,
            lambda: self._insert_rows_stamped(rows, notify, prepare, meanwhile),
            "a fair queue's INSERT",
        )

    def _insert_rows_stamped(
        self,
        rows: JobRows,
        notify: set[str] | None,
        prepare: Callable[[int], None] | None,
        meanwhile: Callable[[Inserted], None] | None,
    ) -> Inserted:
        keys = rows.fairness_keys or [None] * len(rows)
        flow = rows.concurrency_keys or [None] * len(rows)
        with self._stamping_keys(rows.queue, rows.priority, keys, flow) as stamp:
            if stamp is None:
                return super().insert_rows(rows, notify, prepare, meanwhile)
            out = super().insert_rows(rows, notify, prepare, meanwhile)
            stamp(out.ids)
            return out

    def insert_unique(
        self, rows: Sequence[InsertRow], notify: set[str] | None = None
    ) -> list[tuple[int, datetime, datetime, bool]]:
        with self._stamping(rows) as stamp:
            if stamp is None:
                return super().insert_unique(rows, notify)
            out = super().insert_unique(rows, notify)
            stamp([row[0] if row[3] else None for row in out])
            return out

    def insert_windowed(
        self, rows: Sequence[InsertRow], window: Window, notify: set[str] | None = None
    ) -> list[tuple[int, datetime, datetime, bool]]:
        with self._stamping(rows) as stamp:
            if stamp is None:
                return super().insert_windowed(rows, window, notify)
            out = super().insert_windowed(rows, window, notify)
            # A debounced row that replaced a waiting one keeps that one's stamp.
            stamp([row[0] if row[3] else None for row in out])
            return out

    def _any_fair(self, rows: Sequence[InsertRow]) -> bool:
        table = conf.fairness()
        return bool(table) and any(row.queue in table for row in rows)

    def _fair_queue(self, queue: str) -> bool:
        table = conf.fairness()
        return bool(table) and queue in table

    @contextmanager
    def _stamping(
        self, rows: Sequence[InsertRow]
    ) -> Iterator[Callable[[Sequence[int | None]], None] | None]:
        """None when no row goes to a fair queue (or an outer INSERT of ours stamps);
        else, inside a transaction, what stamps the rows by their new ids (None: a row
        not inserted)."""
        table = conf.fairness()
        if not table or not any(row.queue in table for row in rows):
            yield None
            return
        with self._stamped_transaction() as outer:
            if outer:
                yield None
                return

            def stamp(ids: Sequence[int | None]) -> None:
                groups: dict[tuple[str, int], tuple[list[int], list[str | None]]] = {}
                for row, job_id in zip(rows, ids, strict=True):
                    if job_id is None or row.queue not in table or row.concurrency_key is not None:
                        continue
                    got = groups.setdefault((row.queue, row.priority), ([], []))
                    got[0].append(job_id)
                    got[1].append(row.fairness_key)
                for (queue, priority), (group_ids, keys) in sorted(groups.items()):
                    self.stamp_jobs(queue, priority, group_ids, keys)

            yield stamp

    @contextmanager
    def _stamping_keys(
        self, queue: str, priority: int, keys: list[str | None], flow: list[str | None]
    ) -> Iterator[Callable[[Sequence[int]], None] | None]:
        with self._stamped_transaction() as outer:
            if outer:
                yield None
                return

            def stamp(ids: Sequence[int]) -> None:
                chosen = [(i, k) for i, k, f in zip(ids, keys, flow, strict=True) if f is None]
                self.stamp_jobs(queue, priority, [i for i, _ in chosen], [k for _, k in chosen])

            yield stamp

    @contextmanager
    def _stamped_transaction(self) -> Iterator[bool]:
        """A transaction for an INSERT and its stamps; yields whether an outer INSERT of
        ours already stamps (an engine's INSERT may call another of its INSERTs)."""
        connection = self.connection
        if getattr(connection, "_gator_stamping", False):
            yield True
            return
        connection._gator_stamping = True
        try:
            with transaction.atomic(using=self.alias):
                yield False
        finally:
            connection._gator_stamping = False

    # -- the stamps ------------------------------------------------------------------------
    def stamp_jobs(
        self, queue: str, priority: int, ids: Sequence[int], keys: Sequence[str | None]
    ) -> None:
        """Stamp the new jobs ``ids`` of the fair queue ``queue`` at ``priority``, of the
        fairness keys ``keys`` (None: the keyless tenant), in the caller's transaction."""
        if not ids:
            return
        weights = fairness.weights_of(conf.fairness(), queue)
        by_key: dict[str, list[int]] = {}
        for job_id, key in zip(ids, keys, strict=True):
            by_key.setdefault(key or fairness.DEFAULT_KEY, []).append(job_id)
        with self.connection.cursor() as cursor:
            virtual = self.virtual_time(cursor, queue, priority)
            for key in sorted(by_key):
                members = sorted(by_key[key])
                weight = float(weights.get(key, 1))
                last = self._advance(cursor, queue, key, virtual, len(members) / weight)
                self._write_stamps(
                    cursor, key, members, fairness.stamps(last, len(members), weight)
                )

    def virtual_time(self, cursor: Any, queue: str, priority: int) -> float:
        """The virtual time of ``priority`` in the queue: the stamp the fair claim takes
        next among that priority's due jobs, or, with none, the highest counter of the
        queue (all stamped work was served, or waits in other priorities)."""
        cursor.execute(self.fair_head_sql, [queue, priority])
        row = cursor.fetchone()
        if row is not None and row[0] is not None:
            return float(row[0])
        cursor.execute(f"SELECT MAX(last_stamp) FROM {self.share_table} WHERE queue = %s", [queue])
        row = cursor.fetchone()
        return float(row[0]) if row is not None and row[0] is not None else 0.0

    @property
    def fair_head_sql(self) -> str:
        """The stamp at the head of one priority of a fair queue's claim order (one index
        descent); parameters: the queue, the priority."""
        return (
            f"SELECT fair_order FROM {self.job_table} WHERE queue = %s AND {FAIR_SQL}"
            f" AND priority = %s AND next_execution_at <= {self.now_sql}"
            " ORDER BY priority DESC, fair_order, id LIMIT 1"
        )

    @property
    def fair_floor_sql(self) -> str:
        """The lowest stamp of a fair queue's due jobs, over every priority (the upkeep's;
        it reads the queue's entries of the fair index); one parameter, the queue."""
        return (
            f"SELECT MIN(fair_order) FROM {self.job_table} WHERE queue = %s AND {FAIR_SQL}"
            f" AND next_execution_at <= {self.now_sql}"
        )

    def _advance(self, cursor: Any, queue: str, key: str, virtual: float, step: float) -> float:
        """Move the counter of (queue, key) to max(counter, virtual) + step; its new value."""
        cursor.execute(
            f"INSERT INTO {self.share_table} AS s (queue, fairness_key, last_stamp, updated_at)"
            f" VALUES (%s, %s, %s, {self.now_sql}) ON CONFLICT (queue, fairness_key) DO UPDATE"
            f" SET last_stamp = {self.greatest}(s.last_stamp, %s) + %s,"
            f" updated_at = {self.now_sql} RETURNING last_stamp",
            [queue, key, virtual + step, virtual, step],
        )
        return float(cursor.fetchone()[0])

    def _write_stamps(
        self, cursor: Any, key: str, ids: Sequence[int], stamps: Sequence[float]
    ) -> None:
        stored = None if key == fairness.DEFAULT_KEY else key  # as fairness_key() returned
        if self.vendor == "postgresql":  # the stamps as arrays, in one statement
            cursor.execute(
                f"UPDATE {self.job_table} AS j SET fairness_key = %s, fair_order = u.stamp"
                " FROM unnest(%s::bigint[], %s::float8[]) AS u(id, stamp)"
                f" WHERE j.id = u.id AND j.{ACTIVE_SQL}",
                [stored, list(ids), list(stamps)],
            )
            return
        for start in range(0, len(ids), STAMP_CHUNK):
            chunk = ids[start : start + STAMP_CHUNK]
            cases = " ".join(["WHEN %s THEN %s"] * len(chunk))
            params: list[Any] = [stored]
            for job_id, stamp in zip(chunk, stamps[start : start + STAMP_CHUNK], strict=True):
                params += [job_id, stamp]
            cursor.execute(
                f"UPDATE {self.job_table} SET fairness_key = %s, fair_order = CASE id {cases} END"
                f" WHERE id IN ({', '.join(['%s'] * len(chunk))}) AND {ACTIVE_SQL}",
                [*params, *chunk],
            )

    # -- upkeep ----------------------------------------------------------------------------
    def fair_upkeep(self, limit: int = STRAY_BATCH) -> int:
        """Per fair queue: stamp up to ``limit`` ready rows that have no stamp (rows that
        waited there before the queue was made fair, or that a retry moved in from another
        queue), so the fair claim sees them; then delete the counters behind the queue's
        virtual time (they add nothing to it). Counters of queues no longer fair go too.
        Returns how many rows were stamped."""
        table = conf.fairness()
        stamped = 0
        with transaction.atomic(using=self.alias), self.connection.cursor() as cursor:
            names = sorted(table)
            if names:
                marks = ", ".join(["%s"] * len(names))
                cursor.execute(
                    f"DELETE FROM {self.share_table} WHERE queue NOT IN ({marks})", names
                )
            else:
                cursor.execute(f"DELETE FROM {self.share_table}", [])
        for queue in sorted(table):
            with transaction.atomic(using=self.alias), self.connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT id, fairness_key, priority FROM {self.job_table} WHERE queue = %s"
                    f" AND {self.ready_condition()} AND fair_order IS NULL ORDER BY id LIMIT %s"
                    + (" FOR UPDATE SKIP LOCKED" if self._row_lock_sql else ""),
                    [queue, limit],
                )
                strays = cursor.fetchall()
                for priority in sorted({r[2] for r in strays}):
                    these = [r for r in strays if r[2] == priority]
                    self.stamp_jobs(queue, priority, [r[0] for r in these], [r[1] for r in these])
                stamped += len(strays)
                self._prune_counters(cursor, queue)
        return stamped

    def _prune_counters(self, cursor: Any, queue: str) -> None:
        """Delete the counters of ``queue`` below the lowest stamp of its due jobs; with no
        stamped job waiting at all (due or not), all but the highest, which keeps the
        virtual time."""
        cursor.execute(self.fair_floor_sql, [queue])
        row = cursor.fetchone()
        if row is not None and row[0] is not None:
            cursor.execute(
                f"DELETE FROM {self.share_table} WHERE queue = %s AND last_stamp < %s",
                [queue, row[0]],
            )
            return
        cursor.execute(self.fair_waiting_sql, [queue])
        if cursor.fetchone() is not None:
            return  # only jobs not due yet: their stamps still count against the counters
        cursor.execute(f"SELECT MAX(last_stamp) FROM {self.share_table} WHERE queue = %s", [queue])
        row = cursor.fetchone()
        if row is not None and row[0] is not None:
            cursor.execute(
                f"DELETE FROM {self.share_table} WHERE queue = %s AND last_stamp < %s",
                [queue, row[0]],
            )

    @property
    def fair_waiting_sql(self) -> str:
        """One row if a fair queue has a stamped job waiting, due or not."""
        return f"SELECT 1 FROM {self.job_table} WHERE queue = %s AND {FAIR_SQL} LIMIT 1"


def fair_upkeep(engine: JobEngine) -> int:
    """The upkeep of the fair queues on ``engine``'s database (see
    :meth:`FairInserts.fair_upkeep`); 0 without any fair queue or counter."""
    inner = behind(engine)
    if not isinstance(inner, FairInserts):
        return 0
    return inner.fair_upkeep()
