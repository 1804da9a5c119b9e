"""The plain rows passed between dispatch, the engines and the worker.

A leaf of the package: nothing here imports Django's models or any other part of
django_gator, so job classes and chains can build rows without loading the engines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple


@dataclass(slots=True)
class ClaimedJob:
    """A job a worker holds: what it needs to run it and to write its outcome."""

    id: int
    name: str
    args: Any
    kwargs: Any
    queue: str
    priority: int
    attempts: int
    rescues: int
    chain_id: Any = None
    chain_position: int | None = None
    chain: Any = None
    next_execution_at: Any = None  # as the database returned it (for keyset claims)
    created_at: Any = None  # as the database returned it (a datetime, or text on SQLite)
    #: Taken back from a lost worker before: the worker runs it alone (precise blame).
    suspect: bool = False
    #: The batch the job is a member of (see django_gator.engines.batching).
    batch_id: int | None = None
    #: The dispatch's OpenTelemetry context (a carrier dict), or None.
    trace_context: Any = None
    #: Times a stopping worker gave the job back to waiting while it ran.
    handbacks: int = 0
    #: Attempts cut short by a lost database connection, retried without being charged.
    outages: int = 0


class LostClaim(NamedTuple):
    """A running job whose worker's heartbeat lapsed, as lost_claims() read it."""

    id: int
    attempts: int
    owner: str
    rescues: int
    isolated: bool  # the lost attempt ran alone in its worker
    crashes: int  # workers lost before while it ran alone


@dataclass(slots=True)
class InsertRow:
    """One job to insert; the JSON is already validated and serialized."""

    name: str
    args: str
    kwargs: str
    queue: str
    priority: int
    run_at: datetime | None  # None: due now, by database time
    chain_id: str | None = None
    chain_position: int | None = None
    chain: str | None = None
    unique_key: str | None = None
    batch_id: int | None = None
    #: Set for a class with concurrency_limit or rate_limit (see limits.flow_key).
    concurrency_key: str | None = None
    #: What the class's fairness_key() returned (used in a queue of GATOR_FAIRNESS).
    fairness_key: str | None = None


@dataclass(slots=True)
class JobRows:
    """The rows of one dispatch call, by column: what every row shares is held once, what
    differs (the arguments' JSON; the keys of unique and flow-limited jobs) as a list with
    one entry per row. A dispatch_many of 100,000 jobs then builds two lists of strings
    rather than 100,000 :class:`InsertRow` objects, and an engine that can send columns
    (PostgreSQL's COPY and unnest()) sends them as they are."""

    name: str
    queue: str
    priority: int
    run_at: datetime | None  # None: due now, by database time
    args: list[str]
    kwargs: list[str]
    chain_id: str | None = None
    chain_position: int | None = None
    chain: str | None = None
    #: One per row, or None when no row has one.
    unique_keys: list[str | None] | None = None
    #: One per row, or None for a class without limits (see limits.flow_key).
    concurrency_keys: list[str | None] | None = None
    batch_id: int | None = None
    #: One per row (fairness_key()'s answers), or None for a class without fairness_key().
    fairness_keys: list[str | None] | None = None
    #: Not started by then, the rows never run (``expires_at=``, or the class's ``expires``
    #: counted from the dispatch by database time: ``expires_in`` seconds). Set after the
    #: INSERT, in its transaction (see pipeline.jobs).
    expires_at: datetime | None = None
    expires_in: float | None = None
    #: Arguments checked and encoded as they are sent (a large dispatch_many; see
    #: pipeline.encoding.job_rows): until then ``args`` and ``kwargs`` hold placeholders, and
    #: ``encode(start, stop)`` fills in those rows, raising for the first bad item among
    #: them. Whatever reads the columns other than an engine that streams them calls
    #: :meth:`settle` first.
    encode: Callable[[int, int], None] | None = None

    def __len__(self) -> int:
        return len(self.args)

    def settle(self) -> None:
        """Check and encode every row's arguments now, if that was left for later."""
        encode, self.encode = self.encode, None
        if encode is not None:
            encode(0, len(self.args))

    def columns(self) -> dict[str, Any]:
        """Each InsertRow attribute's value: a list (one per row) where rows may differ,
        else the one value they share."""
        return {
            "name": self.name,
            "args": self.args,
            "kwargs": self.kwargs,
            "queue": self.queue,
            "priority": self.priority,
            "run_at": self.run_at,
            "chain_id": self.chain_id,
            "chain_position": self.chain_position,
            "chain": self.chain,
            "unique_key": self.unique_keys,
            "batch_id": self.batch_id,
            "concurrency_key": self.concurrency_keys,
        }

    def rows(self) -> list[InsertRow]:
        """One InsertRow per row, for the statements that take rows one by one."""
        count = len(self.args)
        unique_keys = self.unique_keys or [None] * count
        concurrency_keys = self.concurrency_keys or [None] * count
        fairness_keys = self.fairness_keys or [None] * count
        return [
            InsertRow(
                self.name,
                args,
                kwargs,
                self.queue,
                self.priority,
                self.run_at,
                self.chain_id,
                self.chain_position,
                self.chain,
                unique_key,
                self.batch_id,
                concurrency_key,
                fairness_key,
            )
            for args, kwargs, unique_key, concurrency_key, fairness_key in zip(
                self.args, self.kwargs, unique_keys, concurrency_keys, fairness_keys, strict=True
            )
        ]


class Inserted(NamedTuple):
    """What an INSERT of :class:`JobRows` returns, by column, in the rows' order."""

    ids: list[int]
    created_at: list[datetime]
    next_execution_at: list[datetime]
