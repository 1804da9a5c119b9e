"""What every engine stands on: its connection and transactions, time, the shape of a
claimed row, and the compare-and-set guard that every write after a claim uses.

Every write after a claim is a compare-and-set on the claim: ``id`` + ``state = 'running'``
+ ``attempts`` + ``reserved_by``. Zero rows changed means the job is no longer ours (it was
rescued, re-claimed or changed by an operator): the caller logs it and writes nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from django.db import connections, transaction
from django.utils.dateparse import parse_datetime

from django_gator import conf, jsonsql
from django_gator.models import Job, Queue, Worker
from django_gator.states import (
    RUNNING_SQL,
)

if TYPE_CHECKING:
    from django_gator.engines.contract import JobEngine
    from django_gator.worker.connections import NetworkBounds

#: The rows the ordinary claim takes: no concurrency key (a job of a class with limits has
#: one, and is taken by the limited claim, engines/flow.py). Its own partial index
#: (gator_job_ready) holds only these rows, so the ordinary claim never steps over the others.
UNKEYED_SQL = "concurrency_key IS NULL"
#: The rows the limited claim takes: a job of a class with limits (engines/flow.py), in the
#: partial index gator_job_ready_keyed.
KEYED_SQL = "concurrency_key IS NOT NULL"

JOB_COLUMNS = (
    "id, name, args, kwargs, queue, priority, attempts, rescues, chain_id, chain_position, chain, "
    "next_execution_at, created_at, suspect, batch_id, trace_context, handbacks, outages"
)

#: The ordinary claim's rows looked up by their ids (the primary key's index), whatever the plan
#: PostgreSQL made for the join at the session's first claim, with the table's size then
#: (joined alone, such a plan made on a near-empty table read the whole primary key for the
#: marks and the limited claim: docs/benchmarks.md).
BY_PICKED_IDS = "j.id = ANY(ARRAY(SELECT id FROM picked))"


#: What runs on each connection an engine opens itself, outside Django's: see
#: set_connection_hook().
ConnectionHook = Callable[["JobEngine", Any], None]
_connection_hook: ConnectionHook | None = None


def set_connection_hook(hook: ConnectionHook | None) -> None:
    """Install what is done with each driver connection an engine opens outside Django's
    (PostgreSQL's LISTEN connection) before its first statement: a worker process bounds its
    silence as it does its other connections (worker.connections.bound_connection). The
    engines sit below the worker and do not import it; the app's ready() installs it."""
    global _connection_hook
    _connection_hook = hook


def connection_hook_installed() -> bool:
    return _connection_hook is not None


#: Where an engine whose workers poll hands the queues of the jobs a transaction of its made
#: due, once that transaction has committed: the wakeup datagrams (django_gator.wakeup,
#: above the engines; installed by the app's ready()). See set_wakeup_hook().
WakeupHook = Callable[[str, Collection[str]], None]
_wakeup_hook: WakeupHook | None = None


def set_wakeup_hook(hook: WakeupHook | None) -> None:
    """Install what wakes the idle workers of queues given jobs on an engine without
    LISTEN (``hook(alias, queues)``, called after the commit, or inside the caller's
    transaction for it to defer to its commit)."""
    global _wakeup_hook
    _wakeup_hook = hook


def wakeup_hook_installed() -> bool:
    return _wakeup_hook is not None


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


class EngineCore:
    """An engine's plumbing; see :class:`django_gator.engines.base.Engine`."""

    vendor = ""
    #: Whether listen() works: dispatch pushes a wakeup that workers can wait for.
    can_listen = False
    #: SQL for "now" in database time, as stored by Django for this vendor.
    now_sql = "CURRENT_TIMESTAMP"

    @property
    def notifies(self) -> bool:
        """Whether dispatch and wake() NOTIFY listening workers (see the contract)."""
        return self.can_listen and conf.notify()

    def __init__(self, alias: str) -> None:
        self.alias = alias
        qn = connections[alias].ops.quote_name
        self.job_table = qn(Job._meta.db_table)
        self.worker_table = qn(Worker._meta.db_table)
        self.queue_table = qn(Queue._meta.db_table)

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
    def _raw_transaction(self, begin: str) -> Iterator[Any]:
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
            connection._gator_wake = None
            try:
                yield cursor
            except BaseException:
                connection._gator_in_transaction = False
                connection._gator_wake = None
                cursor.execute("ROLLBACK", [])
                raise
            connection._gator_in_transaction = False
            cursor.execute("COMMIT", [])
        woken, connection._gator_wake = getattr(connection, "_gator_wake", None), None
        if woken:
            self.wake(woken)

    @property
    def pooled(self) -> bool:
        """This alias goes through a transaction-pooling proxy (``GATOR_POOLED_DATABASES``):
        consecutive transactions may run on different server sessions, so nothing may
        rely on session state (SET, LISTEN, prepared statements)."""
        return self.alias in conf.pooled_databases()

    def _opened_own_connection(self, raw: Any) -> None:
        """``raw``, a driver connection this engine opened itself, is about to be used: hand
        it to the installed hook (see set_connection_hook())."""
        hook = _connection_hook
        if hook is not None:
            hook(cast("JobEngine", self), raw)  # every engine is one (see get_engine())

    def prepare_bookkeeping(self) -> None:
        """Tune this thread's connection for the worker's own writes (claims, outcome
        marks, heartbeats); called before each use, cheap when nothing changed."""

    def prepare_worker_session(self, raw: Any, bounds: NetworkBounds) -> None:
        """Have the server give up this worker connection's session, and its transaction
        and locks with it, after ``bounds`` of silence from the worker (a partition).
        ``raw`` is the driver's connection, just opened, in autocommit; called once for each
        connection of a worker process (see worker.connections)."""

    # -- paused queues -------------------------------------------------------------------
    @property
    def not_paused_sql(self) -> str:
        """SQL for: the queue named by the parameter ``%s`` is neither paused nor limited
        (a concurrency or rate limit: its jobs are taken by the limited claim only, see
        engines/flow.py). One primary-key probe of the queue table, with no reference to the
        outer row, so the planner evaluates it once per statement. Part of every ordinary
        claim's WHERE, so a committed pause or limit stops the next claim of every worker."""
        return (
            f"NOT EXISTS (SELECT 1 FROM {self.queue_table} WHERE name = %s"
            " AND (paused OR concurrency IS NOT NULL OR rate_limit <> ''))"
        )

    def unpaused_sql(self, column: str) -> str:
        """SQL for: the queue named by ``column`` is not paused (for a list of queues)."""
        return (
            f"NOT EXISTS (SELECT 1 FROM {self.queue_table} p WHERE p.name = {column} AND p.paused)"
        )

    def wake(self, queues: Collection[str]) -> None:
        """Tell idle workers that ``queues`` may have claimable jobs, once the current
        transaction commits (at once in autocommit): engines whose workers poll send them
        wakeup datagrams (the hook of set_wakeup_hook); inside a transaction of the
        engine's own (_raw_transaction), after its COMMIT. PostgreSQL: NOTIFY instead."""
        if not queues or _wakeup_hook is None:
            return
        connection = self.connection
        if getattr(connection, "_gator_in_transaction", False):
            pending = getattr(connection, "_gator_wake", None) or set()
            connection._gator_wake = pending | set(queues)
            return
        _wakeup_hook(self.alias, queues)

    def db_now(self) -> datetime:
        with self.connection.cursor() as cursor:
            cursor.execute(f"SELECT {self.now_sql}", [])
            return self.to_dt(cursor.fetchone()[0])

    def json_append_sql(self, column: str) -> str:
        """SQL that appends the JSON parameter ``%s`` to the array in ``column``."""
        return jsonsql.append_sql(self.vendor, column)

    #: SQL for "database now plus ``%s`` seconds" (NULL when the parameter is NULL).
    later_sql = ""

    # -- compare-and-set on the claim ---------------------------------------------------
    #: The jobs table as the target of compare-and-set writes (engines may add an index
    #: hint there; see _guard()).
    _cas_table_sql = ""

    def _guard(self, condition: str) -> str:
        """``condition`` AND "still running, and still ours": the check of every
        compare-and-set on a claim. It adds one ``%s``, the worker id, after the
        parameters of ``condition``.

        Engines phrase it (or hint the table) so that the row is found by its primary key,
        never through the partial index of running jobs or the (state, finished_at) index:
        those keep an entry for every job a worker ever ran until vacuum removes it, all
        under the same owner, so a lookup through them would cost more with every job."""
        return f"{condition} AND {RUNNING_SQL} AND reserved_by = %s"

    @property
    def _claim_match(self) -> str:
        """One claim: ``id``, ``attempts`` and the worker id, as three parameters."""
        return f"id = %s AND {self._guard('attempts = %s')}"

    @property
    def _cas_table(self) -> str:
        return self._cas_table_sql or self.job_table
