"""SQLite: one writer at a time. The claim is a single UPDATE ... RETURNING statement, which
takes SQLite's write lock before it reads, so two workers can never take the same row;
multi-statement writes run in BEGIN IMMEDIATE transactions. Atomic jobs, which hold the
write lock while they run, take turns (see AtomicTurns)."""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from django.db import OperationalError, transaction

from django_gator import conf
from django_gator.engines.base import JOB_COLUMNS, UNKEYED_SQL, ClaimedJob, Position
from django_gator.engines.fairness import FairInserts
from django_gator.engines.outages import is_busy
from django_gator.states import READY_SQL, SQL_WAITING, claim_set_sql, live_sql

try:
    import fcntl
except ImportError:  # not on Windows: there the turns are per process
    fcntl = None  # type: ignore[assignment]

#: The longest pause between two atomic jobs' turns, in seconds. SQLite's busy handler
#: sleeps up to 100 ms between two looks at the lock, so a pause of 150 ms lets in every
#: writer that waited through the previous turn.
ATOMIC_PAUSE_MAX = 0.15
#: Longest pause between two tries to open an atomic job's transaction, in seconds.
BEGIN_BACKOFF_MAX = 5.0

logger = logging.getLogger("django_gator.worker")


class SQLiteEngine(FairInserts):
    vendor = "sqlite"
    # The format Django stores (UTC, no zone); '%%' because Django's cursor uses %s params.
    now_sql = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
    # NULL || '...' is NULL, and strftime() of a NULL modifier is NULL.
    later_sql = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s || ' seconds')"

    _mark_in_claim_transaction = True
    # Writers take turns (BEGIN IMMEDIATE): a batch row needs no lock of its own.
    _row_lock_sql = ""
    greatest = "MAX"

    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        # Compare-and-set writes look rows up by rowid only: without the hint, a batch of
        # ids is planned on an index of states, whose running entries grow with every job.
        self._cas_table_sql = f"{self.job_table} NOT INDEXED"
        self.atomic_turns = AtomicTurns()

    @contextmanager
    def atomic_job(self) -> Iterator[None]:
        """An atomic job's transaction, in its turn (see AtomicTurns).

        Its BEGIN IMMEDIATE waits for the write lock up to the connection's busy timeout.
        When another writer held the lock for longer (a stopped process, a long import),
        the job has not started: its thread waits and tries again, rather than fail the
        job with "database is locked"."""
        with self.atomic_turns.turn(self._turns_file()) as began, ExitStack() as stack:
            tries = 0
            while True:
                try:
                    stack.enter_context(transaction.atomic(using=self.alias))
                    break
                except OperationalError as exc:
                    if not is_busy(exc):
                        raise
                    tries += 1
                    logger.warning(
                        "The write lock stayed busy beyond the busy timeout; an atomic job "
                        "waits to begin try=%s",
                        tries,
                    )
                    time.sleep(min(0.1 * 2**tries, BEGIN_BACKOFF_MAX))
            began()
            yield

    def _turns_file(self) -> str | None:
        path = self._database_file()
        return None if path is None else f"{path}-gator.lock"

    def _database_file(self) -> str | None:
        connection = self.connection
        if connection.is_in_memory_db():
            return None
        return str(connection.settings_dict["NAME"])

    # A WAL database is shared through memory (its -shm file), so by one host only.
    workers_share_a_host = True

    def shared_memory_file(self) -> str | None:
        path = self._database_file()
        return None if path is None else f"{path}-shm"

    @contextmanager
    def write_transaction(self) -> Iterator[Any]:
        # Take the write lock up front: a deferred transaction that reads and then writes
        # fails with SQLITE_BUSY when another connection wrote in between.
        with self._raw_transaction("BEGIN IMMEDIATE") as cursor:
            yield cursor

    def insert_sql(self) -> str:
        def col(index: int) -> str:
            return f"json_extract(value, '$[{index}]')"

        return (
            f"INSERT INTO {self.job_table} (name, args, kwargs, queue, priority, state, "
            "attempts, rescues, next_execution_at, created_at, last_error, chain_id, "
            f"chain_position, chain, unique_key, batch_id, concurrency_key) SELECT {col(0)}, "
            f"{col(1)}, {col(2)}, {col(3)}, {col(4)}, {SQL_WAITING}, 0, 0, "
            f"COALESCE({col(5)}, {self.now_sql}), {self.now_sql}, '', "
            f"{col(6)}, {col(7)}, {col(8)}, {col(9)}, {col(10)}, {col(11)} FROM json_each(%s) "
            "ORDER BY key "
            "RETURNING id, created_at, next_execution_at"
        )

    def claim(
        self, worker_id: str, queue: str, limit: int, after: Position | None = None
    ) -> list[ClaimedJob]:
        with self.connection.cursor() as cursor:
            return self._claim(cursor, worker_id, queue, limit)

    def _claim(self, cursor: Any, worker_id: str, queue: str, limit: int) -> list[ClaimedJob]:
        # A fair queue: by (priority, stamp, id), through its own index (docs/fairness.md).
        order = (
            "AND fair_order IS NOT NULL ORDER BY priority DESC, fair_order, id"
            if queue in conf.fairness()
            else "ORDER BY priority DESC, next_execution_at, id"
        )
        sql = (
            f"UPDATE {self.job_table} SET {claim_set_sql(self.now_sql)}"
            f" WHERE id IN (SELECT id FROM {self.job_table}"
            f"  WHERE queue = %s AND {READY_SQL} AND {UNKEYED_SQL}"
            f"  AND next_execution_at <= {self.now_sql} AND {live_sql(self.now_sql)}"
            f"  AND {self.not_paused_sql}"
            f"  {order} LIMIT %s)"
            f" RETURNING {JOB_COLUMNS}"
        )
        cursor.execute(sql, [worker_id, queue, queue, limit])
        jobs = [self.claimed(row) for row in cursor.fetchall()]
        jobs.sort(key=lambda j: (-j.priority, j.id))
        return jobs


class AtomicTurns:
    """Atomic jobs on SQLite take turns on this host, with a pause after each turn.

    An atomic job's transaction holds SQLite's only write lock for as long as the job runs.
    Left to SQLite, the executors of every worker queue in its busy handler, and as one job
    commits, the next one takes the lock again within microseconds, while a web process
    waiting too (its busy handler sleeping up to 100 ms between two looks) seldom finds it
    free: it saw commits of many seconds and "database is locked", and the workers' own
    heartbeats stalled. So an executor first takes the turn: a lock on a file next to the
    database, held by one thread of one process at a time (every process writing to a WAL
    database is on the same host, so the file lock reaches them all). After a turn that held
    the write lock for t seconds, the next turn starts min(t, ATOMIC_PAUSE_MAX) later: atomic
    jobs get at most about half of the write lock's time, and every other writer (the web
    process, heartbeats, claims) gets in between two of them.

    The file lock is a POSIX record lock, which a process forked by a job does not inherit;
    as POSIX locks belong to the process, a thread lock keeps this process's threads in line.
    It is held for the turn only, not during the pause before it. Without fcntl (Windows),
    or for an in-memory database, only the thread lock is taken."""

    def __init__(self) -> None:
        self._thread_lock = threading.Lock()
        self._next_turn = 0.0  # time.monotonic(), when there is no file to keep it in

    @contextmanager
    def turn(self, path: str | None) -> Iterator[Callable[[], None]]:
        """Wait for the turn; yields a callable to call once the write lock is taken."""
        began: list[float] = []

        def mark() -> None:
            began.append(time.monotonic())

        with self._thread_lock:
            if path is None or fcntl is None:
                _pause_until(self._next_turn)
                try:
                    yield mark
                finally:
                    self._next_turn = _next_turn(began)
                return
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                _lock_after_the_pause(fd)
                try:
                    yield mark
                finally:
                    os.pwrite(fd, struct.pack("<d", _next_turn(began)), 0)
            finally:
                os.close(fd)  # and with it the lock


def _lock_after_the_pause(fd: int) -> None:
    """Lock the turns file once the pause after the last turn is over. The lock is not held
    during the pause, so that a process stopped there (SIGSTOP) holds up no other turn; the
    file says when the pause ends (time.monotonic(), the same clock in every process)."""
    while True:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        stored = os.pread(fd, 8, 0)
        delay = (struct.unpack("<d", stored)[0] if len(stored) == 8 else 0.0) - time.monotonic()
        if not 0 < delay <= ATOMIC_PAUSE_MAX:  # over, or not written by this host's clock
            return
        fcntl.lockf(fd, fcntl.LOCK_UN)
        time.sleep(delay)


def _pause_until(moment: float) -> None:
    """Sleep until ``moment`` (time.monotonic()), at most ATOMIC_PAUSE_MAX."""
    delay = moment - time.monotonic()
    if delay > 0:
        time.sleep(min(delay, ATOMIC_PAUSE_MAX))


def _next_turn(began: list[float]) -> float:
    """When the next turn may start: as long after now as this one held the lock, up to
    ATOMIC_PAUSE_MAX."""
    now = time.monotonic()
    held = now - began[0] if began else 0.0
    return now + min(held, ATOMIC_PAUSE_MAX)
