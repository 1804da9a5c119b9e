"""Connection hygiene around a job: after every job, each database connection its thread
holds is left as the job found it.

User code can leave a connection dirty in ways Django does not notice between jobs: a raw
``BEGIN`` (or ``START TRANSACTION``) that was never committed, ``set_autocommit(False)``,
an ``atomic()`` entered by hand and never left, a failed transaction, a session setting
changed with ``SET``. On a reused connection each of these leaks into the next jobs of the
same executor: their writes join the stray transaction and are lost when it is rolled
back, or (on SQLite) the stray transaction holds the write lock and stalls every writer.

:class:`ConnectionWatch` watches the statements a job sends (one list append per
connection, no round trip) and, afterwards, asks each connection the job used whether a
transaction is still open: the driver knows on PostgreSQL and SQLite; MariaDB and MySQL are
asked with one ``SELECT @@in_transaction``. A stray transaction is rolled back, the
connection closed (the next job gets a fresh session), and the job is told, so its attempt
fails with :class:`~django_gator.exceptions.TransactionLeftOpen` rather than being marked
succeeded with its writes undone. A connection on which the job changed session state is
closed too, so no setting outlives the job that made it.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from django_gator.engines.sessions import transaction_left_open
from django_gator.worker.warm import mark_trusted, trusted

logger = logging.getLogger("django_gator.worker")

#: Statements that change a session's state beyond one transaction.
_SESSION_CHANGE = re.compile(
    r"^\s*(?:SET\s+(?!LOCAL\b|TRANSACTION\b|CONSTRAINTS\b)|RESET\b|DISCARD\b|"
    r"PRAGMA\s+\w+\s*=|USE\s)",
    re.IGNORECASE,
)


def before_job(thread_connections: Sequence[BaseDatabaseWrapper]) -> None:
    """Before a job, on each of the thread's connections (``connections.all()``): Django's
    ``close_old_connections()`` (a connection past its age or found broken is closed),
    then a look at the ones kept open.

    An executor keeps its connections between jobs, and the server may have closed one
    meanwhile (a restart, a killed backend, an idle timeout). Without a look, the job's
    first query would fail and the job with it, for a fault that is not its own. The look
    is a zero-timeout poll of the socket, skipped for a connection opened or found quiet in
    the last :data:`~django_gator.worker.warm.TRUST_WINDOW` seconds (see
    :func:`~django_gator.worker.warm.trusted`): a server that ends a session makes it
    readable. Only a connection found so (or one that cannot be polled) gets Django's
    health check (CONN_HEALTH_CHECKS: one ``SELECT 1`` at the job's first query, and a
    reconnect if it fails); a healthy one costs no round trip. One pass over the
    connections, on the path of every job."""
    for connection in thread_connections:
        connection.close_if_unusable_or_obsolete()
        if connection.connection is not None:
            # Attributes of Django's BaseDatabaseWrapper that django-stubs does not declare.
            connection.health_check_enabled = True  # type: ignore[attr-defined]
            connection.health_check_done = trusted(connection)  # type: ignore[attr-defined]


def after_job(thread_connections: Sequence[BaseDatabaseWrapper]) -> None:
    """After a job, on each of the thread's connections: Django's
    ``close_old_connections()`` and ``reset_queries()`` (with DEBUG on, the log of the
    job's queries would otherwise grow job after job), in one pass."""
    for connection in thread_connections:
        connection.close_if_unusable_or_obsolete()
        connection.queries_log.clear()


class _Used:
    """An execute wrapper that notes whether a connection was used, and how."""

    __slots__ = ("session_changed", "used")

    def __init__(self) -> None:
        self.used = False
        self.session_changed = False

    def __call__(
        self, execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: Any
    ) -> Any:
        self.used = True
        if not self.session_changed and isinstance(sql, str) and _SESSION_CHANGE.match(sql):
            self.session_changed = True
        return execute(sql, params, many, context)


def _connected(sender: Any, connection: Any, **kwargs: Any) -> None:
    """A job opened a connection: the statements of its setup (Django's
    ``init_connection_state``, e.g. MariaDB's ``SET SQL_AUTO_IS_NULL = 0``) made the state
    every new connection starts with, not a change of the job's. Without this, each job
    that connected had its connection closed after it, and the next job connected again."""
    used = getattr(connection, "_gator_used", None)
    if used is not None:
        used.session_changed = False
    mark_trusted(connection)


connection_created.connect(_connected, dispatch_uid="django_gator.worker.hygiene")


class ConnectionWatch:
    """Use as ``with ConnectionWatch() as watch: run the job``, then ``watch.clean()``.

    On the hot path of every job: entering and leaving cost one list append and removal
    per database alias, and a job that ran no query is passed over without a look."""

    __slots__ = ("_connections", "_watched")

    def __init__(self, watched: Sequence[BaseDatabaseWrapper] | None = None) -> None:
        """``watched``: the thread's connections (``connections.all()``), if the caller
        has the list already."""
        self._connections = watched
        self._watched: list[tuple[Any, _Used]] = []

    def __enter__(self) -> ConnectionWatch:
        for connection in connections.all() if self._connections is None else self._connections:
            used = _Used()
            # What connection.execute_wrapper() does, without a generator per job.
            connection.execute_wrappers.append(used)
            connection._gator_used = used  # type: ignore[attr-defined]  # for _connected()
            self._watched.append((connection, used))
        return self

    def __exit__(self, *exc: object) -> None:
        for connection, used in self._watched:
            with contextlib.suppress(ValueError):
                connection.execute_wrappers.remove(used)
            connection._gator_used = None

    def used(self) -> bool:
        """Whether a watched connection ran a statement or is inside atomic() (cheap: no
        round trip; safe to call from another thread between two of the job's calls)."""
        return any(used.used or c.in_atomic_block for c, used in self._watched)

    def clean(self) -> list[str]:
        """Restore every connection the job used; returns a description of each stray
        transaction found (empty when the job left none)."""
        problems: list[str] = []
        for connection, used in self._watched:
            if connection.connection is None or not (used.used or connection.in_atomic_block):
                continue  # no query, no transaction (autocommit flipped alone: Django's)
            try:
                open_transaction = transaction_left_open(connection)
            except Exception:
                logger.warning(
                    "Could not check a connection after a job; closing it alias=%s",
                    connection.alias,
                    exc_info=True,
                )
                _discard(connection)
                continue
            if open_transaction:
                problems.append(f"a transaction left open on the database {connection.alias!r}")
                _discard(connection)
            elif used.session_changed:
                logger.debug(
                    "Job changed session state; closing its connection alias=%s",
                    connection.alias,
                )
                _discard(connection)
        return problems


def _discard(connection: Any) -> None:
    """Roll back and close ``connection``, and reset Django's transaction bookkeeping, so
    the thread's next use opens a fresh session."""
    raw = connection.connection
    try:
        if raw is not None:
            raw.rollback()
    except Exception:
        logger.debug("rollback of a dirty connection failed", exc_info=True)
    # An atomic() entered and never left: forget it, as its transaction is gone.
    connection.in_atomic_block = False
    connection.savepoint_ids = []
    connection.atomic_blocks = []
    connection.needs_rollback = False
    connection.commit_on_exit = True
    connection.closed_in_transaction = False
    connection.run_on_commit = []
    try:
        connection.close()
    except Exception:
        logger.debug("closing a dirty connection failed", exc_info=True)
        connection.connection = None
