"""Which connection a worker LISTENs on, when its jobs database sits behind a pooler.

LISTEN needs a session of its own for as long as it listens, which a transaction-pooling
proxy (PgBouncer ``pool_mode = transaction``) never gives: the next transaction may run on
another server session, and the notifications go to whichever client that session serves
next. So for an alias in ``GATOR_POOLED_DATABASES`` the worker listens on the direct alias
named by ``GATOR_LISTEN_DATABASE`` (one connection per worker process); without one it
does not listen, says so once at startup, and polls (``GATOR_POLL_INTERVAL``).
"""

from __future__ import annotations

import logging

from django.db import connections

from django_gator import conf
from django_gator.conf import InvalidSetting
from django_gator.engines import JobEngine, get_engine

logger = logging.getLogger("django_gator.worker")


def listen_engine(engine: JobEngine, poll_interval: float) -> JobEngine | None:
    """The engine whose database the listener of a worker on ``engine`` connects to, or
    None when the worker polls. InvalidSetting when ``GATOR_LISTEN_DATABASE`` names no
    PostgreSQL alias."""
    alias = conf.listen_database()
    # GATOR_LISTEN_DATABASE is a direct connection to GATOR_DATABASE: a worker of another
    # job database (GATOR_QUEUE_DATABASES) listens on its own, unless that one is pooled.
    if alias is not None and engine.alias == conf.database():
        if alias not in connections:
            raise InvalidSetting(
                f"GATOR_LISTEN_DATABASE = {alias!r} is not a key of DATABASES "
                f"(one of {sorted(connections.settings)})"
            )
        listener = get_engine(alias)
        if not listener.can_listen:
            raise InvalidSetting(
                f"GATOR_LISTEN_DATABASE = {alias!r} must be a PostgreSQL database, "
                f"not {listener.vendor}"
            )
        if listener.pooled:
            raise InvalidSetting(
                f"GATOR_LISTEN_DATABASE = {alias!r} is in GATOR_POOLED_DATABASES: LISTEN "
                "needs a direct connection"
            )
        return listener if engine.notifies else None
    if not engine.notifies:
        return None  # SQLite, MariaDB, or GATOR_NOTIFY = False: wakeup datagrams instead
    if engine.pooled:
        logger.warning(
            "No LISTEN: database %r is behind a transaction pooler (GATOR_POOLED_DATABASES) "
            "and GATOR_LISTEN_DATABASE is not set; polling for new jobs every %s s instead",
            engine.alias,
            poll_interval,
        )
        return None
    return engine
