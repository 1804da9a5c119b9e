"""The database connections of a worker process: kept open between jobs, and given up, by
the worker and by the server alike, when the other end has gone silent.

A network partition that drops packets (a failed router, a firewall, a host that vanished;
not a reset) leaves both ends of a TCP connection waiting: by default the server keeps the
session of a lost worker, with its open transaction and its row locks, until the OS
keepalive gives up (2 hours and more), and a worker waiting on a reply learns nothing until
the kernel stops retransmitting (about 15 minutes). Meanwhile another worker has rescued
the lost worker's job after GATOR_HEARTBEAT_TIMEOUT, and its run waits on those locks.

So each connection of a worker process, to every PostgreSQL and MariaDB/MySQL database, is
given up after about GATOR_WORKER_NETWORK_TIMEOUT seconds of silence (by default the
heartbeat timeout), on both ends:

- the client socket: TCP keepalive probes after a third of it, and ``TCP_USER_TIMEOUT`` of
  all of it, so unanswered probes or unacknowledged data end the connection, and connects
  time out after a third (libpq parameters on PostgreSQL; socket options and
  ``connect_timeout`` on MariaDB/MySQL);
- the server session: the same keepalive and user timeout on PostgreSQL (its per-session
  ``tcp_keepalives_*`` and ``tcp_user_timeout``, and ``client_connection_check_interval``
  for a statement still running); on MariaDB, whose keepalive settings are global only,
  ``idle_transaction_timeout`` (see the engines' ``prepare_worker_session``).

A live peer's kernel answers keepalive probes and acknowledges data however busy the
process is, so none of these cut a long statement, a long atomic job that keeps the database
busy, or a long job outside a transaction. The exception is MariaDB's idle transaction
timeout: there a job that leaves its transaction idle (no statement) for longer than the
timeout loses its connection, and its transaction is rolled back. Only worker processes get
these settings (``gator_worker`` calls ``prepare()``): web processes keep theirs.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from django_gator import conf
from django_gator.engines import JobEngine, get_engine, sessions

logger = logging.getLogger("django_gator.worker")


@dataclass(frozen=True, slots=True)
class NetworkBounds:
    """How long a worker connection may hear nothing from its other end, in the units each
    setting takes; all derived from one number of seconds."""

    seconds: float
    #: Seconds of silence before the first keepalive probe.
    keepalive_idle: int
    #: Seconds between two probes.
    keepalive_interval: int
    #: Unanswered probes that end the connection (where TCP_USER_TIMEOUT is not supported).
    keepalive_count: int
    #: TCP_USER_TIMEOUT: data unacknowledged (or probes unanswered) for this long ends it.
    user_timeout_ms: int
    #: Seconds a new connection may take (libpq accepts no less than 2).
    connect_timeout: int
    #: MariaDB: seconds a session may stay idle inside a transaction.
    idle_transaction_timeout: int

    @classmethod
    def for_timeout(cls, seconds: float) -> NetworkBounds:
        idle = max(1, round(seconds / 3))
        interval = max(1, round(seconds / 6))
        return cls(
            seconds=seconds,
            keepalive_idle=idle,
            keepalive_interval=interval,
            keepalive_count=max(1, math.ceil((seconds - idle) / interval)),
            user_timeout_ms=max(1000, round(seconds * 1000)),
            connect_timeout=max(2, round(seconds / 3)),
            idle_transaction_timeout=max(1, math.ceil(seconds)),
        )


_lock = threading.Lock()
_users = 0  # WorkerProcess.run() calls in progress (tests run several in one process)
_saved: dict[str, tuple[Any, Any]] = {}  # alias -> CONN_MAX_AGE and OPTIONS before
_bounds: NetworkBounds | None = None


def warn_about_debug() -> None:
    """With ``DEBUG = True`` Django keeps each connection's last queries (up to 9,000 of
    them: ``connection.queries``). A worker clears its executor threads' logs after each
    job, but its claiming, heartbeat and other threads' logs fill up: say so at start, as
    Celery does."""
    if settings.DEBUG:
        logger.warning(
            "DEBUG is True: Django keeps the last %s queries of every database connection "
            "in memory (connection.queries), so this worker's memory grows (by about 16 MiB "
            "in the first tens of thousands of jobs). Never run workers with DEBUG = True "
            "in production.",
            BaseDatabaseWrapper.queries_limit,
        )


def prepare() -> Callable[[], None]:
    """Set up the connections of a worker process; returns a function that undoes it.

    Persistent connections: ``close_old_connections()`` runs around every job; with
    ``CONN_MAX_AGE = 0`` (Django's default, right for web requests) it would reconnect for
    every job. Workers keep each connection for ``GATOR_WORKER_CONN_MAX_AGE`` seconds
    instead; broken connections are still dropped and replaced.

    Bounded silence: see the module's docstring. Options the project set itself in a
    database's ``OPTIONS`` are kept."""
    global _users, _bounds
    seconds = conf.worker_network_timeout()  # raises on a bad value, before any change
    max_age = conf.worker_conn_max_age()
    with _lock:
        _users += 1
        if _users > 1:
            return _undo
        _bounds = NetworkBounds.for_timeout(seconds) if seconds > 0 else None
        warn_about_debug()
        for alias in connections:
            settings_dict = connections.settings[alias]
            _saved[alias] = (settings_dict.get("CONN_MAX_AGE", 0), settings_dict.get("OPTIONS"))
            if settings_dict.get("CONN_MAX_AGE", 0) == 0:
                settings_dict["CONN_MAX_AGE"] = max_age
            if _bounds is not None:
                client = sessions.client_options(connections[alias], _bounds)
                settings_dict["OPTIONS"] = {**client, **(settings_dict.get("OPTIONS") or {})}
        if _bounds is not None:
            connection_created.connect(_on_connection_created, dispatch_uid=__name__)
    return _undo


def _undo() -> None:
    global _users, _bounds
    with _lock:
        _users -= 1
        if _users > 0:
            return
        connection_created.disconnect(dispatch_uid=__name__)
        _bounds = None
        for alias, (max_age, options) in _saved.items():
            settings_dict = connections.settings[alias]
            settings_dict["CONN_MAX_AGE"] = max_age
            if options is None:
                settings_dict.pop("OPTIONS", None)
            else:
                settings_dict["OPTIONS"] = options
        _saved.clear()


def _on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    """A new connection in a worker process: bound its silence on both ends."""
    if _bounds is not None and sessions.is_bounded(connection):
        bound_connection(get_engine(connection.alias), connection.connection)


def bound_connection(engine: JobEngine, raw: Any) -> None:
    """Bound the silence of ``raw``, a driver connection a worker process just opened, on
    both ends (also for connections Django does not open, like the LISTEN one). Nothing
    outside a worker process, or when off. Never raises: a connection that cannot be
    bounded is still used, with the defaults, and a warning says so."""
    current = _bounds
    if current is None or getattr(raw, "_gator_network_bounds", None) == current:
        return  # a pooled connection checked out again
    try:
        sessions.bound_session(engine, raw, current)
    except Exception as exc:  # the driver's own errors, not Django's, on a raw connection
        logger.warning(
            "Could not bound the silence of a database connection alias=%s error=%r",
            engine.alias,
            exc,
        )
        return
    raw._gator_network_bounds = current
