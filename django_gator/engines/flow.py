"""The limited claim: jobs held to a concurrency or rate limit, claimed under the lock of
their queue's row.

Which jobs: every ready job of a queue with limits (``concurrency``, ``rate_limit`` on its
row in ``django_gator_queue``), and the ready jobs of a class with limits
(``concurrency_limit``, ``rate_limit``), which carry a concurrency key from dispatch and sit
in an index of their own (``gator_job_ready_keyed``; MariaDB: ``flow_rank``). The ordinary
claim takes neither: its index holds no keyed row, and its pause probe also refuses a
limited queue. Queues and classes without limits never reach this module.

Two ways to claim, one rule: lock the queue's row, then count (running jobs of the queue
and of each key, ledger starts) and take what fits, in one transaction. On every database
a statement at a time (engines/flow_walk.py); on PostgreSQL in one round trip
(engines/flow_postgresql.py), which falls back to the walk when its chunk overflows or its
connection cannot send several statements at once.

A job over a limit is not touched: it stays ``waiting``, no attempt is charged, and a later
claim takes it when a slot or the window allows. A class's key limits are counted across
every queue but serialized by the lock of the queue being claimed: a class whose jobs are
spread over several queues can briefly run one more per key per extra queue.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, cast

from django_gator.attempts import Mark
from django_gator.engines.base import ClaimedJob
from django_gator.engines.contract import JobEngine, behind
from django_gator.engines.flow_keyset import KEYSET_LOOKBACK, Candidate
from django_gator.engines.flow_ledger import ClassLimits, Policy
from django_gator.engines.flow_postgresql import OneTripClaim, Trip, usable
from django_gator.engines.flow_statement import ClassRow, Request
from django_gator.engines.flow_walk import FlowWalk, logger
from django_gator.limits import parse_rate
from django_gator.models import Queue
from django_gator.registry import registered_jobs

if TYPE_CHECKING:
    from django_gator.engines.postgresql import PostgresEngine

__all__ = ["ClassLimits", "FlowClaims", "Policy"]

#: The one-trip claim (PostgreSQL) of keyed rows: rows read, at least (twice the claim's
#: want when more); a chunk too full of rows that do not fit is walked on by FlowWalk.
ONE_TRIP_CHUNK = 16
#: Seconds the one-trip claim of a queue goes on reading rate limits after it last saw one.
RATES_MEMORY = 10.0


class FlowClaims(FlowWalk):
    """The limited claim and what the worker's router reads, for one engine."""

    def __init__(self, job_engine: JobEngine) -> None:
        engine = behind(job_engine)
        super().__init__(engine)
        #: PostgreSQL: the claim in one round trip (engines/flow_postgresql.py).
        self.one_trip = (
            # By vendor, not by class: importing the PostgreSQL engine imports psycopg.
            OneTripClaim(cast("PostgresEngine", engine), KEYSET_LOOKBACK)
            if engine.vendor == "postgresql"
            else None
        )
        self._usable: bool | None = None
        #: The registered classes with limits, with the registry's size and the policy
        #: they were read with.
        self._classes: tuple[int, Policy, list[ClassRow]] | None = None
        #: Per queue: until when (time.monotonic()) the one-trip claim reads rate limits.
        self._rates_until: dict[str, float] = {}

    # -- what the router reads --------------------------------------------------------------
    def limited_queues(self) -> set[str]:
        """Queues with a concurrency or rate limit on their row."""
        return set(Queue.objects.using(self.engine.alias).limited_names())

    def keyed_queues(self) -> set[str]:
        """Queues holding ready jobs of limited classes: a skip scan of their index."""
        job = self.engine.job_table
        cond = self._keyed_condition()
        sql = (
            "WITH RECURSIVE q(queue) AS ("
            f" SELECT (SELECT queue FROM {job} WHERE {cond} ORDER BY queue LIMIT 1)"
            " UNION ALL"
            f" SELECT (SELECT queue FROM {job} WHERE {cond} AND queue > q.queue"
            "  ORDER BY queue LIMIT 1) FROM q WHERE q.queue IS NOT NULL"
            ") SELECT queue FROM q WHERE queue IS NOT NULL"
        )
        with self.engine.connection.cursor() as cursor:
            cursor.execute(sql, [])
            return {row[0] for row in cursor.fetchall()}

    def _keyed_condition(self) -> str:
        return self.engine.keyed_ready_condition()

    def held_back(self, queues: Iterable[str], limited: set[str]) -> bool:
        """Whether one of ``queues`` holds a due job for the limited claim (its jobs of
        limited classes; all its jobs if it is in ``limited``), the queue being neither
        paused nor given a rate_limit that cannot be read. One index probe per queue."""
        rows = Queue.objects.using(self.engine.alias).filter(name__in=list(queues))
        now = self.engine.db_now()
        with self.engine.connection.cursor() as cursor:
            for row in sorted(rows, key=lambda r: r.name):
                try:
                    parse_rate(row.rate_limit)
                except ValueError:
                    continue
                if row.paused:
                    continue
                for keyed in (True, False) if row.name in limited else (True,):
                    sql, params = self._read_sql(row.name, keyed, set(), None, 1, now)
                    cursor.execute(sql, params)
                    if cursor.fetchone() is not None:
                        return True
        return False

    # -- the claim ---------------------------------------------------------------------------
    def claim(
        self,
        worker_id: str,
        queue: str,
        limit: int,
        policy: Policy,
        *,
        keyed: bool = True,
        limited: bool = True,
        marks: Sequence[Mark] = (),
    ) -> tuple[list[ClaimedJob], list[int]]:
        """Claim up to ``limit`` jobs of ``queue`` within every limit (see the module
        docstring), writing the success ``marks`` first in the same transaction (their
        slots are free for this claim). ``keyed``: False when the caller knows the queue
        holds no ready job of a limited class (one read fewer). ``limited``: False when
        it knows the queue's row has no limits (PostgreSQL: its jobs without a key are
        then not read; a limit set since is seen at the caller's next look). Returns the
        jobs claimed and the ids whose mark was written."""
        if self.one_trip is not None and limit > 0 and self._one_trip_usable():
            kinds = (True, False) if keyed and limited else (True,) if keyed else (False,)
            return self._claim_one_trip(worker_id, queue, limit, policy, kinds, marks)
        return self._walk_claim(worker_id, queue, limit, policy, keyed, marks)

    def _one_trip_usable(self) -> bool:
        if self._usable is None:
            self._usable = usable(self.engine)  # type: ignore[arg-type]
        return self._usable

    def _claim_one_trip(
        self,
        worker_id: str,
        queue: str,
        limit: int,
        policy: Policy,
        kinds: tuple[bool, ...],
        marks: Sequence[Mark],
    ) -> tuple[list[ClaimedJob], list[int]]:
        """PostgreSQL: the claim in one round trip (engines/flow_postgresql.py); when its
        chunk was too full of rows that did not fit, the walk goes on a statement at a time
        (in a transaction of its own) for the rest.

        The rate limits are left out of the statement (a shorter one to run) unless the
        queue or the rows it read had one within the last RATES_MEMORY seconds; a claim
        without them takes nothing of a queue with a rate, nor any row of a class with
        one, and says so: the claim is made again with them, for what is left."""
        pending = list(marks)
        written: list[int] = []
        if any(mark.batch_id is not None for mark in pending):
            # A batch member's mark settles its batch in its transaction: written first.
            written = self.engine.mark_succeeded(worker_id, pending)
            pending = []
        jobs, more = self._trips(worker_id, queue, limit, policy, kinds, pending, written)
        if more and len(jobs) < limit:
            keyed = True in kinds
            walked, _ = self._walk_claim(worker_id, queue, limit - len(jobs), policy, keyed, ())
            jobs += walked
        jobs.sort(key=lambda j: (-j.priority, j.id))
        return jobs, written

    def _trips(
        self,
        worker_id: str,
        queue: str,
        limit: int,
        policy: Policy,
        kinds: tuple[bool, ...],
        marks: list[Mark],
        written: list[int],
    ) -> tuple[list[ClaimedJob], bool]:
        """The one-trip claims of _claim_one_trip: a second one with the rate limits when
        the first, without them, met one and took less than ``limit``; a third and fourth
        when the queue's row was gone (made again). Appends the ids of the ``marks``
        written to ``written``; returns the jobs claimed and whether the walk may find
        more."""
        assert self.one_trip is not None
        classes = self._class_rows(policy)
        keyed = True in kinds
        rates = time.monotonic() < self._rates_until.get(queue, 0.0)
        jobs: list[ClaimedJob] = []
        more = False
        for _ in range(4):
            want = limit - len(jobs)
            # Rows without a key never fail to fit once read: a chunk of those needs no
            # slack.
            chunk = max(ONE_TRIP_CHUNK, 2 * want) if keyed else want
            self._ensure_row(queue)
            floors = {kind: self._floor(queue, kind) for kind in kinds}
            request = Request(worker_id, queue, want, chunk, classes, floors, rates)
            trip = self.one_trip.claim(request, marks)
            written += trip.written
            marks = []
            if not trip.found:
                self._rows.discard(queue)  # its row was deleted since: make it again
                continue
            self._took(queue, trip)
            jobs += trip.jobs
            more = trip.more
            if trip.rated or trip.rated_rows:
                self._rates_until[queue] = time.monotonic() + RATES_MEMORY
                if not rates:
                    rates = True
                    if len(jobs) < limit:
                        continue
            break
        return jobs, more

    def _took(self, queue: str, trip: Trip) -> None:
        """Move the keyset positions past what ``trip`` claimed."""
        if trip.bad_rate:
            logger.error("Queue has a bad rate_limit; nothing claimed queue=%s", queue)
        self._seen = [
            Candidate(j.id, j.name, trip.keys[j.id], j.priority, due, due)
            for j in trip.jobs
            if (due := j.next_execution_at) is not None
        ]
        self._seen += [Candidate(*row, row[4]) for row in trip.skipped]
        self._advance(queue, {job.id for job in trip.jobs})

    def _class_rows(self, policy: Policy) -> list[ClassRow]:
        """The registered classes with limits, as the one-trip claim reads them."""
        names = registered_jobs()
        if self._classes is None or self._classes[:2] != (len(names), policy):
            rows = []
            for name in sorted(names):
                limits = policy(name)
                if limits is None:
                    continue
                rate = limits.rate
                rows.append(
                    ClassRow(
                        name,
                        limits.concurrency,
                        rate.starts if rate else None,
                        rate.seconds if rate else None,
                    )
                )
            self._classes = (len(names), policy, rows)
        return self._classes[2]
