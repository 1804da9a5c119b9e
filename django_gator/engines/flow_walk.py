"""The limited claim a statement at a time, on every database (PostgreSQL sends it in one
round trip when it can: engines/flow_postgresql.py). Its keyset positions are kept in
engines/flow_keyset.py, its limits and ledger in engines/flow_ledger.py.

One claim, one transaction:

1. Lock the queue's row (``SELECT ... FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE`` already
   serializes writers), and read the database's now: every limited claim of the queue, in
   every worker, waits for the one before it, so two fetchers never take the same last
   slot. The counts below are read after the lock: under REPEATABLE READ (MariaDB) the
   snapshot is taken at the first plain read, after the previous holder committed.
2. The queue's budget: its concurrency minus its running rows (counted live through a
   partial index, so a job taken back from a lost worker gives its slot back with the
   rescue), its rate minus the starts in the ledger younger than the window.
3. Walk the ready rows in claim order (priority, then due time, then id), in chunks: a row
   whose class key has no room left is skipped, and its key is excluded from the next
   chunks' SQL, so a backlog of one key costs one chunk, not a wall (no head-of-line
   blocking). Running rows are counted per (class, key) across the whole fleet, rate-limited
   starts per key in the ledger (``django_gator_flow_start``).
4. Mark the picked rows running (the ready state is checked again), with the locked ``now``
   as their ``locked_at``, and write one ledger row per start and rate scope; ledger rows
   older than their window are deleted as they pass.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django_gator.attempts import Mark
from django_gator.engines.base import JOB_COLUMNS, KEYED_SQL, UNKEYED_SQL, ClaimedJob, Engine
from django_gator.engines.flow_keyset import Candidate, KeysetPositions
from django_gator.engines.flow_ledger import Ledger, Policy, key_scope, queue_scope
from django_gator.limits import Rate, parse_rate
from django_gator.models import Queue
from django_gator.states import READY_SQL, RUNNING_SQL, claim_set_sql, live_sql

logger = logging.getLogger("django_gator.worker")

#: Rows read per chunk of the walk, at least (more when the claim wants more).
CHUNK = 64
#: Chunks read per claim at most: the rows a claim looks at are bounded.
MAX_CHUNKS = 8


@dataclass(frozen=True)
class Walk:
    """What one claim reads: the queue, whether the queue has limits (its rows without a
    key are read too), whether to read its keyed rows."""

    queue: str
    limited: bool
    keyed: bool


class _NoRow(Exception):
    """The queue's row is gone: roll back, make it again, claim again."""


class FlowWalk(KeysetPositions):
    """The limited claim a statement at a time, for one engine, with the keyset positions
    of the limited claims (see the module docstring)."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.ledger = Ledger(engine)
        self.mysql = engine.vendor == "mysql"
        self.lock_sql = "" if engine.vendor == "sqlite" else " FOR UPDATE"
        self._rows: set[str] = set()  # queues known to have a row to lock

    def _walk_claim(
        self,
        worker_id: str,
        queue: str,
        limit: int,
        policy: Policy,
        keyed: bool,
        marks: Sequence[Mark],
    ) -> tuple[list[ClaimedJob], list[int]]:
        """The claim of the module docstring, a statement at a time."""
        for _ in range(2):
            self._ensure_row(queue)
            try:
                claimed = self._claim(worker_id, queue, limit, policy, keyed, marks)
            except _NoRow:
                claimed = None
            if claimed is not None:
                self._advance(queue, {job.id for job in claimed[0]})
                return claimed
            self._rows.discard(queue)  # its row was deleted since: make it again
        return [], self.engine.mark_succeeded(worker_id, marks) if marks else []

    def _claim(
        self,
        worker_id: str,
        queue: str,
        limit: int,
        policy: Policy,
        keyed: bool,
        marks: Sequence[Mark],
    ) -> tuple[list[ClaimedJob], list[int]] | None:
        """One claim's transaction; None if the queue has no row to lock."""
        engine = self.engine
        with engine.write_transaction() as cursor:
            written = engine._mark_succeeded(cursor, worker_id, marks) if marks else []
            cursor.execute(
                f"SELECT paused, concurrency, rate_limit, {engine.now_sql} FROM "
                f"{engine.queue_table} WHERE name = %s{self.lock_sql}",
                [queue],
            )
            row = cursor.fetchone()
            if row is None:
                if marks:
                    raise _NoRow  # roll the marks back; they are written with the retry
                return None
            if row[0] or limit <= 0:
                return [], written
            concurrency, rate_text, now = row[1], row[2], engine.to_dt(row[3])
            try:
                rate = parse_rate(rate_text)
            except ValueError:
                logger.error("Queue has a bad rate_limit; nothing claimed queue=%s", queue)
                return [], written
            budget = limit
            if rate is not None:
                started = self.ledger.starts(cursor, [queue_scope(queue)], rate, now)
                budget = min(budget, rate.starts - started.get(queue_scope(queue), 0))
            if budget <= 0:
                return [], written
            walk = Walk(queue, limited=concurrency is not None or rate is not None, keyed=keyed)
            picked = self._pick(cursor, walk, budget, concurrency, policy, now)
            if not picked:
                return [], written
            jobs = self._mark_running(cursor, worker_id, [c.id for c in picked], now)
            self.ledger.record(cursor, queue if rate else None, rate, jobs, picked, policy, now)
        jobs.sort(key=lambda j: (-j.priority, j.id))
        return jobs, written

    def _ensure_row(self, queue: str) -> None:
        if queue not in self._rows:
            Queue.objects.using(self.engine.alias).get_or_create(name=queue)
            self._rows.add(queue)

    def _running_keys(self, cursor: Any) -> dict[tuple[str, str], int]:
        """Running jobs per (class, key), across every queue and worker."""
        if self.mysql:
            sql = (
                f"SELECT name, running_key, COUNT(*) FROM {self.engine.job_table} "
                "WHERE running_key IS NOT NULL GROUP BY name, running_key"
            )
        else:
            sql = (
                f"SELECT name, concurrency_key, COUNT(*) FROM {self.engine.job_table} "
                f"WHERE {RUNNING_SQL} AND {KEYED_SQL} GROUP BY name, concurrency_key"
            )
        cursor.execute(sql, [])
        return {(r[0], r[1]): int(r[2]) for r in cursor.fetchall()}

    def _pick(
        self,
        cursor: Any,
        walk: Walk,
        budget: int,
        concurrency: int | None,
        policy: Policy,
        now: datetime,
    ) -> list[Candidate]:
        """The rows to claim: in claim order, each key within its room, at most
        ``concurrency`` running in the queue (its running rows are counted by the first
        read; see the module docstring, step 3)."""
        room: dict[tuple[str, str], float] = {}
        running: dict[tuple[str, str], int] | None = None
        excluded: set[tuple[str, str]] = set()
        picked: list[Candidate] = []
        after: Candidate | None = None
        chunk = max(CHUNK, 2 * budget)
        for _ in range(MAX_CHUNKS):
            count_running = concurrency is not None and after is None
            if after is None:
                self._seen = []
            rows, in_queue = self._candidates(
                cursor, walk, excluded, after, chunk, now, count_running
            )
            if count_running and concurrency is not None:
                budget = min(budget, concurrency - in_queue)
            if not rows or budget <= 0:
                break
            new = {(c.name, c.key) for c in rows if c.key is not None} - room.keys()
            self._seen += rows
            if new:
                if running is None:
                    running = self._running_keys(cursor)
                self._measure_room(cursor, new, running, policy, now, room)
                excluded |= {pair for pair in new if room[pair] <= 0}
            for candidate in rows:
                if candidate.key is not None:
                    pair = (candidate.name, candidate.key)
                    if room[pair] <= 0:
                        continue
                    room[pair] -= 1
                    if room[pair] <= 0:
                        excluded.add(pair)
                picked.append(candidate)
                if len(picked) >= budget:
                    return picked
            if len(rows) < chunk:
                break
            after = rows[-1]
        return picked

    def _measure_room(
        self,
        cursor: Any,
        pairs: Iterable[tuple[str, str]],
        running: dict[tuple[str, str], int],
        policy: Policy,
        now: datetime,
        room: dict[tuple[str, str], float],
    ) -> None:
        """How many more jobs each (class, key) may start now."""
        by_rate: dict[Rate, list[tuple[str, str]]] = {}
        for pair in pairs:
            limits = policy(pair[0])
            free: float = float("inf")
            if limits is not None and limits.concurrency is not None:
                free = limits.concurrency - running.get(pair, 0)
            if limits is not None and limits.rate is not None:
                by_rate.setdefault(limits.rate, []).append(pair)
            room[pair] = free
        for rate, rated in by_rate.items():
            counts = self.ledger.starts(cursor, [key_scope(*p) for p in rated], rate, now)
            for pair in rated:
                room[pair] = min(room[pair], rate.starts - counts.get(key_scope(*pair), 0))

    def _candidates(
        self,
        cursor: Any,
        walk: Walk,
        excluded: set[tuple[str, str]],
        after: Candidate | None,
        chunk: int,
        now: datetime,
        count_running: bool,
    ) -> tuple[list[Candidate], int]:
        """The next ``chunk`` ready rows of the queue in claim order, after ``after``: the
        keyed ones (without the ``excluded`` keys) and, in a limited queue, the others; and,
        with ``count_running``, the queue's running jobs (0 without), read by the same
        statement."""
        reads = [True] if walk.keyed else []
        if walk.limited:
            reads.append(False)
        parts: list[str] = []
        params: list[Any] = []
        for keyed in reads:
            floor = self._floor_parts(walk.queue, keyed, after, now)
            for extra, extra_params in floor or [("", [])]:
                sql, part_params = self._read_sql(
                    walk.queue, keyed, excluded, after, chunk, now, extra, extra_params
                )
                parts.append(sql)
                params += part_params
        if not parts:
            return [], 0
        running = "0"
        if count_running:
            running = (
                f"(SELECT COUNT(*) FROM {self.engine.job_table} WHERE {RUNNING_SQL} AND queue = %s)"
            )
            params.append(walk.queue)
        union = " UNION ALL ".join(
            f"SELECT * FROM ({part}) AS p{i}" for i, part in enumerate(parts)
        )
        # The count as a row of its own (id NULL), so that it comes back with no candidate.
        cursor.execute(
            f"SELECT * FROM ({union}) AS c UNION ALL "
            f"SELECT NULL, NULL, NULL, NULL, NULL, {running}",
            params,
        )
        rows: list[Candidate] = []
        in_queue = 0
        to_dt = self.engine.to_dt
        for r in cursor.fetchall():
            if r[0] is None:
                in_queue = int(r[5])
            else:
                rows.append(Candidate(r[0], r[1], r[2], r[3], to_dt(r[4]), r[4]))
        if len(parts) > 1:
            rows.sort(key=Candidate.order)
            del rows[chunk:]
        return rows, in_queue

    def _read_sql(
        self,
        queue: str,
        keyed: bool,
        excluded: set[tuple[str, str]],
        after: Candidate | None,
        chunk: int,
        now: datetime,
        extra: str = "",
        extra_params: Sequence[Any] = (),
    ) -> tuple[str, list[Any]]:
        engine = self.engine
        at = engine.adapt_dt(now)
        # Not expired at the claim's time (its parameter follows the extra ones).
        extra += f" AND {live_sql('%s')}"
        params: list[Any] = [queue, at, *extra_params, at]
        if self.mysql:
            index, rank = ("gator_job_flow_my", "flow_rank")
            if not keyed:
                index, rank = ("gator_job_ready_my", "ready_rank")
            source = f"{engine.job_table} FORCE INDEX ({index})"
            where = f"queue = %s AND {rank} IS NOT NULL AND next_execution_at <= %s{extra}"
            order = f"{rank}, next_execution_at, id"
        else:
            source = engine.job_table
            kind = KEYED_SQL if keyed else UNKEYED_SQL
            where = f"queue = %s AND {READY_SQL} AND {kind} AND next_execution_at <= %s{extra}"
            order = "priority DESC, next_execution_at, id"
        if after is not None:
            where += (
                " AND (priority < %s OR (priority = %s AND (next_execution_at > %s"
                " OR (next_execution_at = %s AND id > %s))))"
            )
            due = after.raw_due
            params += [after.priority, after.priority, due, due, after.id]
        if keyed and excluded:
            pairs = sorted(excluded)
            where += (
                " AND (name, concurrency_key) NOT IN (" + ", ".join(["(%s, %s)"] * len(pairs)) + ")"
            )
            params += [item for pair in pairs for item in pair]
        sql = (
            f"SELECT id, name, concurrency_key, priority, next_execution_at, 0 AS n "
            f"FROM {source} WHERE {where} ORDER BY {order} LIMIT %s"
        )
        return sql, [*params, chunk]

    def _mark_running(
        self, cursor: Any, worker_id: str, ids: list[int], now: datetime
    ) -> list[ClaimedJob]:
        """Claim ``ids`` (still ready: an operator may have cancelled one meanwhile), with
        the locked ``now`` as their claim time."""
        engine = self.engine
        marks = ", ".join(["%s"] * len(ids))
        at = engine.adapt_dt(now)
        sql = (
            f"UPDATE {engine.job_table} SET {claim_set_sql('%s')} "
            f"WHERE id IN ({marks}) AND {READY_SQL} AND {live_sql('%s')}"
        )
        params = [worker_id, at, at, *ids, at]
        if engine.update_returning:
            cursor.execute(f"{sql} RETURNING {JOB_COLUMNS}", params)
            return [engine.claimed(row) for row in cursor.fetchall()]
        cursor.execute(sql, params)
        cursor.execute(
            f"SELECT {JOB_COLUMNS} FROM {engine.job_table} WHERE id IN ({marks}) "
            f"AND {RUNNING_SQL} AND reserved_by = %s",
            [*ids, worker_id],
        )
        return [engine.claimed(row) for row in cursor.fetchall()]
