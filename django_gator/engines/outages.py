"""Which errors mean that the database went away, rather than that a statement failed.

A job whose own queries meet a restarting server, a failover or a killed connection did
nothing wrong: its attempt is retried once the database is back, without charging its
retry budget (:func:`django_gator.worker.policy.outage_failure`). This module only tells
those errors apart, for every driver the engines support, by what the driver attaches to
its exceptions (PostgreSQL's SQLSTATE, MySQL's error number); it imports no driver but
the standard library's sqlite3.

What counts as an outage:

- PostgreSQL (psycopg): a connection-level error with no SQLSTATE ("server closed the
  connection unexpectedly", "consuming input failed", "the connection is closed"); class 08
  (connection exception); 57P01 ``admin_shutdown`` ("terminating connection due to
  administrator command": a fast restart, ``pg_terminate_backend``), 57P02
  ``crash_shutdown``, 57P03 ``cannot_connect_now`` (the server is starting); 53300
  ``too_many_connections``; 25006 ``read_only_sql_transaction`` (the connection reached a
  server that is a standby now: after a failover, until the connection string finds the
  new primary).
- MySQL and MariaDB (mysqlclient): 2002/2003 (cannot connect), 2006 (server has gone away),
  2013 and 2055 (lost connection), 1927 (connection killed), 1053 (server shutdown in
  progress), 4031 (disconnected by the server), 1040 (too many connections), and 1290 when it
  names the server's read-only option.
- Any driver's ``InterfaceError`` (a connection already closed).

SQLite has no server to lose: "database is locked" is another writer's doing, told apart
by :func:`is_busy` (a failed attempt that met it is tried again soon, see
:mod:`django_gator.worker.policy`).
"""

from __future__ import annotations

import sqlite3

#: PostgreSQL SQLSTATEs of an outage, beyond class 08.
PG_OUTAGE_STATES = frozenset({"57P01", "57P02", "57P03", "53300", "25006"})
#: MySQL/MariaDB error numbers of an outage (1290 only with "read-only" in its message).
MYSQL_OUTAGE_CODES = frozenset({1040, 1053, 1927, 2002, 2003, 2006, 2013, 2055, 4031})
MYSQL_READ_ONLY = 1290
#: How deep to follow ``__cause__`` / ``__context__`` (Django raises its own error from
#: the driver's; a job may wrap it once more).
DEPTH = 8


def is_outage(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an error it was raised from or while handling, says the database
    connection or server was lost (see the module docstring)."""
    seen: set[int] = set()
    todo = [exc]
    while todo and len(seen) < DEPTH:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if _says_outage(current):
            return True
        todo += [current.__cause__, current.__context__]
    return False


def _says_outage(exc: BaseException) -> bool:
    names = {cls.__name__ for cls in type(exc).__mro__}
    module = type(exc).__module__
    if "InterfaceError" in names and _database_error(module):
        return True
    if module.startswith("psycopg"):
        state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
        if state is None:
            return "OperationalError" in names
        return state.startswith("08") or state in PG_OUTAGE_STATES
    if module.startswith(("MySQLdb", "pymysql")):
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        if code in MYSQL_OUTAGE_CODES:
            return True
        message = str(exc.args[1]) if len(exc.args) > 1 else ""
        return code == MYSQL_READ_ONLY and "read-only" in message
    return False


def _database_error(module: str) -> bool:
    return module.startswith(("psycopg", "MySQLdb", "pymysql", "django.db"))


def is_busy(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an error it was raised from, is SQLite's SQLITE_BUSY ("database
    is locked"): another connection held the write lock beyond the busy timeout."""
    for _ in range(5):  # Django's OperationalError is raised from the driver's
        if exc is None:
            return False
        if isinstance(exc, sqlite3.OperationalError):
            return getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY
        exc = exc.__cause__
    return False
