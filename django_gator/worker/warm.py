"""Warm connections: an executor thread opens the database connections job code uses
before it takes a job, so that no job pays a connect inside its pickup.

A new PostgreSQL connection costs several milliseconds (the TCP and TLS handshakes, the
server's fork, authentication, the worker's session settings); a job whose thread had none
open paid them between its claim and its first query. Executor threads had none right after
a worker started or recycled, after a kept connection reached its age, and after hygiene
closed one a job left dirty.

So, before each wait for a job, an executor thread (:class:`WarmConnections`):

- opens each alias of ``GATOR_WARM_CONNECTIONS`` (default: ``default`` and
  ``GATOR_DATABASE``) that it does not hold open;
- renews a kept connection shortly before it reaches ``GATOR_WORKER_CONN_MAX_AGE``, while
  the thread is idle (the wait for a job ends at that time), rather than letting the next
  job's ``close_old_connections()`` close it and the job reconnect.

Kept healthy without a query per job: before a job, :func:`server_spoke` asks the kernel,
with a zero-timeout ``poll()`` of the connection's socket, whether the server sent anything
since the connection went idle. A server that terminates a session (a restart, a
failover, ``pg_terminate_backend``, ``KILL CONNECTION``, an idle timeout) sends an error
message or closes the socket, and either makes it readable; a healthy idle connection has
nothing to read. Only then does the job's first query run Django's health check (one
``SELECT 1``) and reconnect first. (Django's check alone costs that round trip in every
job that queries.) A connection that cannot be polled (SQLite, a driver without
``fileno()``) gets Django's health check as before. A connection opened or found quiet in
the last ``TRUST_WINDOW`` (0.5 s) is not polled again: a busy thread looks at most twice a
second.

``GATOR_WARM_CONNECTIONS = []`` opts out: threads connect on their job's first query, and
hold a connection only once a job used it.
"""

from __future__ import annotations

import logging
import math
import select
import time
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import connections

from django_gator import conf

logger = logging.getLogger("django_gator.worker")

#: A kept connection is renewed this share of its age before it would be closed (at least
#: one second before), so a job handed out meanwhile never finds it expired.
RENEW_EARLY = 0.1
#: After a failed connect, the thread tries again this many seconds later (while idle).
RETRY_AFTER = 5.0
#: A connection opened, or found quiet by :func:`server_spoke`, this many seconds ago is
#: trusted without another look (see :func:`trusted`).
TRUST_WINDOW = 0.5

_last_warning: dict[str, float] = {}  # alias -> time.monotonic() of the last warning


def warm_aliases(served: str | None = None) -> tuple[str, ...]:
    """The aliases each executor thread keeps open, from ``GATOR_WARM_CONNECTIONS``
    (None: ``default``, ``GATOR_DATABASE`` and ``served``, the job database the worker
    serves). :class:`~django_gator.conf.InvalidSetting`
    naming an alias that is not a key of ``DATABASES``."""
    configured = conf.warm_connections()
    if configured is None:
        defaults = ("default", conf.database(), served or conf.database())
        configured = [a for a in defaults if a in settings.DATABASES]
    aliases = tuple(dict.fromkeys(configured))
    for alias in aliases:
        if alias not in settings.DATABASES:
            raise conf.InvalidSetting(
                f"GATOR_WARM_CONNECTIONS names {alias!r}, which is not a key of DATABASES "
                f"({', '.join(sorted(settings.DATABASES))})"
            )
    return aliases


class WarmConnections:
    """The connections one executor thread opens before it takes a job."""

    __slots__ = ("aliases",)

    def __init__(self, aliases: Sequence[str]) -> None:
        self.aliases = tuple(aliases)

    def warm(self) -> float | None:
        """Open the connections not open, renew the ones about to reach their age; return
        when (``time.monotonic()``) to come back, or None when nothing is due. Never
        raises: a connection that cannot be opened is left to the job (and logged)."""
        now = time.monotonic()
        due: float | None = None
        for alias in self.aliases:
            connection = connections[alias]
            if connection.in_atomic_block:
                continue  # never on an executor between jobs; hygiene's to deal with
            renew_at = _renew_at(connection)
            if renew_at is not None and renew_at <= now:
                connection.close()
            if connection.connection is None:
                if not _connect(connection):
                    due = now + RETRY_AFTER if due is None else min(due, now + RETRY_AFTER)
                    continue
                renew_at = _renew_at(connection)
            if renew_at is not None:
                due = renew_at if due is None else min(due, renew_at)
        return due


def _renew_at(connection: Any) -> float | None:
    """When a kept connection is renewed (before ``close_at``, its end of age)."""
    close_at = connection.close_at
    if close_at is None or connection.connection is None:
        return None
    max_age = connection.settings_dict.get("CONN_MAX_AGE") or 0
    return close_at - max(max_age * RENEW_EARLY, 1.0)


def _connect(connection: Any) -> bool:
    try:
        connection.ensure_connection()
    except Exception as exc:
        now = time.monotonic()
        if now - _last_warning.get(connection.alias, -1e9) > 60:
            _last_warning[connection.alias] = now
            logger.warning(
                "Could not open a connection before a job; the job will try alias=%s error=%r",
                connection.alias,
                exc,
            )
        return False
    return True


def trusted(connection: Any) -> bool:
    """Whether ``connection`` (open) can be used by the next job without Django's health
    check: it was opened, or its socket found quiet, in the last :data:`TRUST_WINDOW`
    seconds, or :func:`server_spoke` finds it quiet now (and it is trusted from now on).

    The window keeps a busy thread from polling before every job: the poll's system call
    releases the interpreter lock, and with many executor threads each release can hand
    the lock to another thread (a no-op drain of 16 threads lost about a fifth of its rate
    to it). Connection pools make the same trade (HikariCP's alive-bypass window, 500 ms).
    A session the server ends inside the window is met by the job's first query: an
    outage, so the attempt goes back to the queue uncharged (see docs/reliability.md)."""
    now = time.monotonic()
    if now - getattr(connection, "_gator_trusted_at", -math.inf) < TRUST_WINDOW:
        return True
    if server_spoke(connection) is False:
        connection._gator_trusted_at = now
        return True
    return False


def mark_trusted(connection: Any) -> None:
    """``connection`` was just opened: healthy for :data:`TRUST_WINDOW` seconds (one with
    no socket to poll, SQLite's, keeps Django's health check)."""
    if getattr(connection.connection, "fileno", None) is not None:
        connection._gator_trusted_at = time.monotonic()


def server_spoke(connection: Any) -> bool | None:
    """Whether the server sent something on ``connection``'s idle socket (a message that
    ends the session, or its close): True means it cannot be trusted; False, it can;
    None when there is no socket to ask (SQLite, a driver without ``fileno()``)."""
    raw = connection.connection
    fileno = getattr(raw, "fileno", None)
    if fileno is None:  # SQLite: no socket
        return None
    try:
        poller = select.poll()
        poller.register(fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(poller.poll(0))
    except (OSError, ValueError, AttributeError) as exc:  # a closed or broken socket
        logger.debug("polling a connection's socket failed alias=%s: %r", connection.alias, exc)
        return True
    except Exception:  # the driver's own error for a connection it knows is closed
        return True
