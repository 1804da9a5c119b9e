"""The one loop that runs a write again after the database ended its transaction to break a
deadlock: a unique dispatch (:mod:`django_gator.pipeline.jobs`) and a workflow step's final
write with its settling (:meth:`WorkflowStatements.with_steps`) both go through it."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DatabaseError

from django_gator.logutil import safe

T = TypeVar("T")
logger = logging.getLogger("django_gator.engines")

#: Tries of a write in a transaction of its own that the database ends to break a deadlock
#: (InnoDB picks a victim; PostgreSQL's deadlock detector too).
DEADLOCK_TRIES = 10
#: Longest pause between two of those tries, in seconds (random, doubling up to this).
DEADLOCK_MAX_PAUSE = 0.5


def retrying_deadlocks(
    engine: Any,
    write: Callable[[], T],
    what: str,
    in_callers_transaction: Callable[[DatabaseError], BaseException] | None = None,
) -> T:
    """``write()``, run again (up to :data:`DEADLOCK_TRIES` times, after a short random
    pause) when ``engine.is_deadlock()`` says the database ended its transaction to break
    a deadlock. ``what`` names the write in the log line of a retry.

    Only when the transaction is ours: inside the caller's ``atomic()`` block, InnoDB rolled
    back the caller's whole transaction, and on PostgreSQL the caller's transaction still
    holds the locks that made the cycle (only a savepoint was rolled back), so trying again
    would deadlock again. Then the error is raised, or the one
    ``in_callers_transaction(error)`` makes of it (which says so)."""
    attempt = 1
    while True:
        ours = not engine.connection.in_atomic_block
        try:
            return write()
        except DatabaseError as exc:
            if not engine.is_deadlock(exc):
                raise
            if not ours:
                if in_callers_transaction is not None:
                    raise in_callers_transaction(exc) from exc
                raise
            if attempt >= DEADLOCK_TRIES:
                raise
            logger.info(
                "Deadlock, retrying write=%s try=%s error=%s", what, attempt, safe(str(exc))
            )
        time.sleep(random.uniform(0, min(0.01 * 2**attempt, DEADLOCK_MAX_PAUSE)))
        attempt += 1
