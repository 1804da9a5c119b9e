"""Enqueueing: ``dispatch``, ``dispatch_many`` and a batch's members, through the insertion
pipeline (:mod:`django_gator.pipeline`): validate and encode the rows, then insert them in
the caller's transaction (or at its commit, with ``on_commit``) and wake workers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async

from django_gator import conf, databases, windows
from django_gator.models.batches import current_batch
from django_gator.pipeline import core
from django_gator.pipeline.encoding import Payloads, job_rows
from django_gator.pipeline.jobs import JobsInsert

if TYPE_CHECKING:
    from django_gator.models import Job
    from django_gator.queueable import Queueable
    from django_gator.rows import JobRows


def enqueue(
    job_class: type[Queueable],
    items: Sequence[tuple[Sequence[Any], Mapping[str, Any]]],
    *,
    wait: timedelta | float | None = None,
    at: datetime | None = None,
    queue: str | None = None,
    priority: int | None = None,
    on_commit: bool | str | None = None,
    chain: tuple[str, int, str] | None = None,
    many: bool = False,
    expires_at: datetime | None = None,
) -> list[Job]:
    """Validate and insert one job per (args, kwargs) item; returns the rows in order.

    The INSERT runs on the connection of the queue's job database (``GATOR_DATABASE``, or
    the alias ``GATOR_QUEUE_DATABASES`` routes the queue to) and so joins a transaction
    that is open there; a routed job dispatched while only another database has a
    transaction open waits for its commit. With ``on_commit`` (True for the default alias,
    or an alias name) the INSERT itself waits for that alias's transaction to commit and is
    dropped on rollback; use it when the jobs table lives in another database than the
    caller's transaction.
    """
    rows, payloads = job_rows(job_class, items, wait, at, queue, priority, chain, many)
    windows.settle_dispatch(job_class, rows, expires_at)
    return _submit(job_class, rows, payloads, on_commit)


async def aenqueue(
    job_class: type[Queueable],
    items: Sequence[tuple[Sequence[Any], Mapping[str, Any]]],
    *,
    wait: timedelta | float | None = None,
    at: datetime | None = None,
    queue: str | None = None,
    priority: int | None = None,
    on_commit: bool | str | None = None,
    chain: tuple[str, int, str] | None = None,
    many: bool = False,
    expires_at: datetime | None = None,
) -> list[Job]:
    """:func:`enqueue` from async code. The arguments are validated here, on the event
    loop, so a bad dispatch raises before any thread is used; the INSERT then runs through
    ``sync_to_async(thread_sensitive=True)``: in the thread of the caller's transaction
    (Django's rule for sync code called from async code), so it joins that transaction
    and ``on_commit`` waits for its commit as in sync code."""
    rows, payloads = job_rows(job_class, items, wait, at, queue, priority, chain, many)
    windows.settle_dispatch(job_class, rows, expires_at)
    return await sync_to_async(_submit, thread_sensitive=True)(job_class, rows, payloads, on_commit)


def _submit(
    job_class: type[Queueable], rows: JobRows, payloads: Payloads, on_commit: bool | str | None
) -> list[Job]:
    """Hand validated rows to the pipeline; a dispatch inside ``with Batch(...)`` joins the
    batch (refused now, before anything is written, if it has no room)."""
    if not len(rows):
        return []
    alias = conf.database()
    if conf.get("GATOR_QUEUE_DATABASES"):
        alias, on_commit = _routed(rows.queue, on_commit)
    member_of = current_batch()
    if member_of is not None:
        member_of.check_room(len(rows))
        member_of.check_database(alias, rows.queue)
    return core.submit(JobsInsert(job_class, alias, rows, payloads, member_of), on_commit)


def _routed(queue: str, on_commit: bool | str | None) -> tuple[str, bool | str | None]:
    """With GATOR_QUEUE_DATABASES: the database of ``queue`` (checked for its tables once
    per process), and when the caller holds a transaction open on another database and
    none on that one, the INSERT waits for that transaction's commit (``on_commit``
    unless the caller chose)."""
    alias = databases.for_queue(queue)
    if alias != conf.database():
        databases.check_migrated(alias)
    if on_commit is None and not conf.dispatch_on_commit():
        on_commit = databases.caller_transaction(alias)
    return alias, on_commit
