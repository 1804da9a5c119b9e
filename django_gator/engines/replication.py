"""What a read replica and a worker's database say about replication: how far a replica is
behind its primary, where the primary's writes have reached, and whether a server refuses
writes. The statements for ``django_gator.replicas`` (GATOR_READ_DATABASE) and for the
worker's start-up check; each function takes Django database aliases.

PostgreSQL measures a standby's lag by position first: a standby that has replayed the
primary's current WAL position is not behind, however old its last replayed transaction
is (``now() - pg_last_xact_replay_timestamp()`` keeps growing on the standby of an idle
primary although nothing is missing). Only a standby that is behind is given that age as
its lag: the time since the last transaction it replayed was committed, which is how
stale what it shows may be. MariaDB and MySQL report ``Seconds_Behind_Master`` (or
``_Source``) in ``SHOW REPLICA STATUS``; a server that is not a replica there shows no row
(lag 0). SQLite has no replicas (lag 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connections

#: Seconds a new connection to the read database may take, unless its OPTIONS set
#: ``connect_timeout`` (libpq accepts no less than 2).
CONNECT_TIMEOUT = 2


@dataclass(frozen=True, slots=True)
class Lag:
    """How far a read database is behind. ``seconds``: None when it cannot be told (the
    reason is ``unknown``); ``position``: where its replay has reached (PostgreSQL: bytes
    of WAL), to compare with a write's :func:`write_position`; ``standby``: whether the
    server is a physical standby (PostgreSQL in recovery) or a replica (MariaDB/MySQL)."""

    seconds: float | None
    position: int | None = None
    standby: bool = False
    unknown: str = ""

    def has_replayed(self, position: int | None) -> bool:
        """Whether the replica shows a write made at ``position`` (None: unknown, so
        assumed not, unless the replica is no standby at all)."""
        if not self.standby:
            return True
        return position is not None and self.position is not None and self.position >= position


def bound_connect(alias: str, seconds: float = CONNECT_TIMEOUT) -> None:
    """Give this thread's connection to ``alias`` a short connect timeout (unless its
    OPTIONS set one), so a read database that vanished does not hold a page for the
    driver's default (libpq waits for ever, mysqlclient about 10 s). The thread's own
    wrapper takes a copy of the settings: other threads and the settings are untouched."""
    wrapper = connections[alias]
    if wrapper.vendor not in ("postgresql", "mysql"):
        return
    options = wrapper.settings_dict.get("OPTIONS") or {}
    if "connect_timeout" in options:
        return
    wrapper.settings_dict = {
        **wrapper.settings_dict,
        "OPTIONS": {**options, "connect_timeout": max(2, round(seconds))},
    }


def _one_row(alias: str, sql: str) -> tuple[Any, ...] | None:
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, [])
        row = cursor.fetchone()
    return None if row is None else tuple(row)


#: On the read database: whether it is a standby, where its replay has reached (as a number
#: of bytes) and the age of the last transaction it replayed. One statement.
PG_REPLAY_SQL = (
    "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn() - '0/0'::pg_lsn, "
    "EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp())"
)
#: On the primary: where its writes have reached (a standby's replay position if the
#: alias is itself a standby, which the worker refuses). One statement.
PG_WRITE_SQL = (
    "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
    "ELSE pg_current_wal_lsn() END) - '0/0'::pg_lsn"
)


def write_position(alias: str) -> int | None:
    """Where the writes of ``alias`` (the primary) have reached, to compare with a
    replica's :attr:`Lag.position`; None where that is not measured (not PostgreSQL).
    One statement on PostgreSQL, none elsewhere."""
    if connections[alias].vendor != "postgresql":
        return None
    row = _one_row(alias, PG_WRITE_SQL)
    return None if row is None or row[0] is None else int(row[0])


def lag(replica: str, primary: str) -> Lag:
    """How far ``replica`` is behind ``primary``. Raises DatabaseError when the replica
    does not answer; PostgreSQL asks the primary for its position only when the replica
    is a standby (two statements then, one otherwise), and if the primary does not
    answer, judges by the age of the last replayed commit alone."""
    vendor = connections[replica].vendor
    if vendor == "postgresql":
        return _postgres_lag(replica, primary)
    if vendor == "mysql":
        return _mysql_lag(replica)
    return Lag(0.0)


def _postgres_lag(replica: str, primary: str) -> Lag:
    in_recovery, replayed, age = _one_row(replica, PG_REPLAY_SQL) or (False, None, None)
    if not in_recovery:
        return Lag(0.0)  # not a standby (a logical replica, or the primary itself)
    position = None if replayed is None else int(replayed)
    if position is None:
        return Lag(None, None, True, "it has replayed nothing yet")
    try:
        wrote = write_position(primary)
    except DatabaseError:  # the primary's trouble, not the replica's: judge by the age alone
        wrote = None
    if wrote is not None and position >= wrote:
        return Lag(0.0, position, True)
    if age is None:
        return Lag(None, position, True, "it is behind and has replayed no transaction yet")
    return Lag(max(0.0, float(age)), position, True)


def _mysql_lag(replica: str) -> Lag:
    with connections[replica].cursor() as cursor:
        try:
            cursor.execute("SHOW REPLICA STATUS", [])
        except DatabaseError as exc:  # the REPLICATION CLIENT / SLAVE MONITOR privilege
            return Lag(None, None, True, f"SHOW REPLICA STATUS was refused ({exc})")
        names = [column[0] for column in cursor.description or ()]
        row = cursor.fetchone()
    if row is None:
        return Lag(0.0)  # not a replica
    status = dict(zip(names, row, strict=False))
    behind = status.get("Seconds_Behind_Source", status.get("Seconds_Behind_Master"))
    if behind is None:
        return Lag(None, None, True, "its replication is stopped (Seconds_Behind_Master is NULL)")
    return Lag(float(behind), None, True)


def read_only_reason(alias: str) -> str | None:
    """Why the server of ``alias`` refuses writes, or None if it takes them: a PostgreSQL
    standby (``pg_is_in_recovery()``) or a session that is read-only by default
    (``default_transaction_read_only``, ``transaction_read_only``); a MariaDB/MySQL server
    with ``read_only`` on (every user without the SUPER or READ ONLY ADMIN privilege is
    refused) or a read-only session. One statement; nothing on SQLite."""
    connection: Any = connections[alias]
    if connection.vendor == "postgresql":
        row = _one_row(
            alias,
            "SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only'), "
            "current_setting('transaction_read_only')",
        )
        recovery, default_read_only, read_only = row or (False, "off", "off")
        if recovery:
            return "it is a standby in recovery (pg_is_in_recovery() is true)"
        if default_read_only == "on" or read_only == "on":
            return "its sessions are read-only (default_transaction_read_only = on)"
        return None
    if connection.vendor == "mysql":
        session = "tx_read_only" if connection.mysql_is_mariadb else "transaction_read_only"
        row = _one_row(alias, f"SELECT @@global.read_only, @@session.{session}")
        read_only, session_read_only = row or (0, 0)
        if int(read_only):
            return "its read_only variable is ON (a replica)"
        if int(session_read_only):
            return f"its sessions are read-only ({session} = 1)"
    return None
