"""How the worker's threads treat their database connections when the database fails:
which errors are worth retrying, how long to wait between tries, when to give up, and how
a broken connection is dropped so that the next use reconnects.

(How long a connection may stay silent before either end gives it up is in
:mod:`django_gator.worker.connections`.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import InterfaceError, InternalError, OperationalError, connections

logger = logging.getLogger("django_gator.worker")

T = TypeVar("T")
#: Longest pause between two tries of a write while the database is unreachable.
MAX_BACKOFF = 5.0
#: Database errors worth retrying: the connection or the server, not the statement.
TRANSIENT_ERRORS = (OperationalError, InterfaceError, InternalError)


def refused(exc: BaseException) -> bool:
    """Whether trying the write again would meet ``exc`` again: not an error of the
    connection or the server (those are retried), but of the statement or the code."""
    return not isinstance(exc, TRANSIENT_ERRORS)


class Retrier:
    """Runs database operations until they succeed; the database may be restarting.

    Only errors of the connection or the server (an outage, a lock timeout, a deadlock)
    are retried. A permanent error (the database refused the data or the statement:
    DataError, IntegrityError, ProgrammingError) would fail the same way forever, so it is
    raised at once for the caller to deal with.

    ``giving_up(until_stop)`` says when to stop trying: the worker is being forced to
    stop, or, for an operation run ``until_stop``, a stop was asked for at all. Whatever
    was not written is then rescued by another worker after this one's heartbeat lapses.
    """

    def __init__(self, alias: str, worker_id: str, giving_up: Callable[[bool], bool]) -> None:
        self.alias = alias
        self.worker_id = worker_id
        self.giving_up = giving_up

    def __call__(self, what: str, action: Callable[[], T], *, until_stop: bool = False) -> T | None:
        """``action()``'s result, or None if it gave up."""
        failures = 0
        while True:
            try:
                return action()
            except TRANSIENT_ERRORS:
                failures += 1
                if self.giving_up(until_stop) and failures > 1:
                    logger.exception("Giving up: %s worker=%s", what, self.worker_id)
                    return None
                logger.warning(
                    "Database error, will retry: %s worker=%s try=%s",
                    what,
                    self.worker_id,
                    failures,
                    exc_info=failures == 1,
                )
                drop_connection(self.alias)
                pause_until = time.monotonic() + min(0.05 * 2**failures, MAX_BACKOFF)
                while time.monotonic() < pause_until and not self.giving_up(until_stop):
                    time.sleep(min(0.05, max(pause_until - time.monotonic(), 0)))
                if until_stop and self.giving_up(True):
                    logger.warning("Stopped while retrying: %s worker=%s", what, self.worker_id)
                    return None


def backoff(failures: int) -> float:
    """Seconds a loop waits after its ``failures``-th failure in a row."""
    return min(0.1 * 2**failures, MAX_BACKOFF)


def drop_connection(alias: str) -> None:
    """Close this thread's connection after an error, so the next use reconnects."""
    try:
        connection = connections[alias]
        if connection.in_atomic_block:
            return
        connection.close()
    except Exception:
        logger.debug("closing a broken connection failed", exc_info=True)
