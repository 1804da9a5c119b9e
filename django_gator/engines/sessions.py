"""A worker's database sessions, per database: the client options that bound a worker
connection's silence, the socket options and session settings applied once it is open
(``django_gator.worker.connections``), and whether a job left a transaction open on it
(``django_gator.worker.hygiene``)."""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

from django_gator.engines.contract import JobEngine

if TYPE_CHECKING:
    from django_gator.worker.connections import NetworkBounds

#: The databases whose worker connections have their silence bounded (SQLite has no
#: network between the worker and its database).
BOUNDED = ("postgresql", "mysql")


def is_bounded(connection: Any) -> bool:
    """Whether a worker bounds the silence of ``connection`` (Django's)."""
    return bool(connection.vendor in BOUNDED)


def client_options(connection: Any, bounds: NetworkBounds) -> dict[str, Any]:
    """The driver's connection OPTIONS that bound a new connection to the database of
    ``connection`` (Django's wrapper, not connected) by ``bounds``."""
    if connection.vendor == "postgresql":
        return {
            "keepalives": 1,
            "keepalives_idle": bounds.keepalive_idle,
            "keepalives_interval": bounds.keepalive_interval,
            "keepalives_count": bounds.keepalive_count,
            "tcp_user_timeout": bounds.user_timeout_ms,
            "connect_timeout": bounds.connect_timeout,
        }
    if connection.vendor == "mysql":
        # mysqlclient has no keepalive options (they are set on the socket once connected),
        # and its read_timeout would cut a long statement: only the connect is bounded.
        return {"connect_timeout": bounds.connect_timeout}
    return {}


def bound_session(engine: JobEngine, raw: Any, bounds: NetworkBounds) -> None:
    """Bound the silence of ``raw``, a driver connection just opened, on both ends: the
    client socket where the driver has no option for it (MySQL), then the server's session
    (``engine.prepare_worker_session``). Raises the driver's errors."""
    if engine.vendor == "mysql":
        set_socket_options(raw.fileno(), bounds)
    engine.prepare_worker_session(raw, bounds)


def set_socket_options(fd: int, bounds: NetworkBounds) -> None:
    """TCP keepalive and user timeout on the socket ``fd`` (a TCP one; others are left)."""
    sock = socket.socket(fileno=os.dup(fd))
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (
            ("TCP_KEEPIDLE", bounds.keepalive_idle),
            ("TCP_KEEPINTVL", bounds.keepalive_interval),
            ("TCP_KEEPCNT", bounds.keepalive_count),
            ("TCP_USER_TIMEOUT", bounds.user_timeout_ms),
        ):
            option = getattr(socket, name, None)  # Linux has all four; others may not
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
    finally:
        sock.close()


def transaction_left_open(connection: Any) -> bool:
    """Whether ``connection`` (a Django wrapper, connected, used by the job) is inside a
    transaction that the job opened and did not end: the driver knows on PostgreSQL and
    SQLite; MariaDB and MySQL are asked (``SELECT @@in_transaction``)."""
    if connection.in_atomic_block or not connection.get_autocommit():
        return True
    raw = connection.connection
    if connection.vendor == "postgresql":
        import psycopg

        status = raw.info.transaction_status
        return bool(status != psycopg.pq.TransactionStatus.IDLE)
    if connection.vendor == "sqlite":
        return bool(raw.in_transaction)
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT @@in_transaction")
            row = cursor.fetchone()
        return bool(row and row[0])
    return False
