"""A claim or success mark that met a row moved to another partition meanwhile, on
partitioned storage (engines/partitions.py): run again."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DatabaseError

logger = logging.getLogger("django_gator.engines")

#: Tries of a hot statement that a concurrent move of one of its rows made PostgreSQL refuse.
MOVE_TRIES = 5
T = TypeVar("T")


def moved(exc: BaseException) -> bool:
    """PostgreSQL refused to lock or write a row because another transaction moved it to
    another partition meanwhile (SQLSTATE 40001, even in READ COMMITTED: it cannot follow
    the row there as it follows an update within a table)."""
    cause = exc.__cause__ or exc
    return getattr(cause, "sqlstate", None) == "40001" and "another partition" in str(cause)


def retrying_moves(engine: Any, statement: Callable[[], T]) -> T:
    """``statement()`` (one statement in a transaction of its own: a claim, success marks),
    run again when :func:`moved`: its transaction was rolled back whole, and the next run
    sees the row where it went (a finished job: no longer claimable, no longer running).
    Inside the caller's transaction the error is raised."""
    attempt = 1
    while True:
        try:
            return statement()
        except DatabaseError as exc:
            if not moved(exc) or engine.connection.in_atomic_block or attempt >= MOVE_TRIES:
                raise
            logger.info("Row moved by a concurrent write, running again try=%s", attempt)
            attempt += 1
