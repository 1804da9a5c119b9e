"""What the conformance tests share: which contract members a test covers, and the
statements an operation sends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from django.db import connections

from django_gator.engines.contract import JobEngine

F = TypeVar("F", bound=Callable[..., Any])


def contract_members() -> set[str]:
    """The public names of the JobEngine protocol."""
    return {name for name in vars(JobEngine) if not name.startswith("_")}


def covers(*members: str) -> Callable[[F], F]:
    """Mark a test as the conformance test of these contract members (checked by
    test_contract_members.py; a name not in the contract fails at import)."""
    unknown = set(members) - contract_members()
    if unknown:
        raise AssertionError(f"not members of JobEngine: {sorted(unknown)}")

    def mark(test: F) -> F:
        test.contract_members = members  # type: ignore[attr-defined]
        return test

    return mark


@contextmanager
def statements(alias: str = "default") -> Iterator[list[str]]:
    """The SQL of every statement sent on this thread's connection of ``alias`` meanwhile
    (a round trip each), through an execute wrapper: it sees the engines' prepared cursors
    too, and BEGIN/COMMIT sent as statements, but not the driver's own transaction calls
    (Django's atomic() on PostgreSQL). The connection is opened first, so the session
    set-up a new connection sends (MariaDB's isolation level) is not counted."""
    connections[alias].ensure_connection()
    sent: list[str] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    with connections[alias].execute_wrapper(record):
        yield sent


def writes(sent: list[str]) -> list[str]:
    """The statements that are not transaction control."""
    control = ("BEGIN", "START TRANSACTION", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")
    return [sql for sql in sent if not sql.lstrip().upper().startswith(control)]
