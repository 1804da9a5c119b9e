"""Enqueueing: validate, insert in the caller's transaction, wake workers on commit."""

from __future__ import annotations

import json
import logging
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.models.base import ModelState

from django_gator import conf, deferred, immediate, limits, signals, tracing, validation, wakeup
from django_gator.engines import Engine, InsertRow, get_engine
from django_gator.exceptions import DispatchDeadlock
from django_gator.logutil import safe
from django_gator.models import Batch, Job, JobState
from django_gator.models.batches import current_batch
from django_gator.registry import is_registered

if TYPE_CHECKING:
    from django_gator.queueable import Queueable

logger = logging.getLogger("django_gator.dispatch")


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
) -> list[Job]:
    """Validate and insert one job per (args, kwargs) item; returns the rows in order.

    The INSERT runs on the connection of ``GATOR_DATABASE`` and so joins a transaction that
    is open there. With ``on_commit`` (True for the default alias, or an alias name) the
    INSERT itself waits for that alias's transaction to commit and is dropped on rollback;
    use it when the jobs table lives in another database than the caller's transaction.
    """
    rows, payloads = _rows(job_class, items, wait, at, queue, priority, chain, many)
    return _store(job_class, rows, payloads, on_commit)


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
) -> list[Job]:
    """:func:`enqueue` from async code. The arguments are validated here, on the event
    loop, so a bad dispatch raises before any thread is used; the INSERT then runs through
    ``sync_to_async(thread_sensitive=True)``: in the thread of the caller's transaction
    (Django's rule for sync code called from async code), so it joins that transaction
    and ``on_commit`` waits for its commit as in sync code."""
    rows, payloads = _rows(job_class, items, wait, at, queue, priority, chain, many)
    return await sync_to_async(_store, thread_sensitive=True)(job_class, rows, payloads, on_commit)


def _rows(
    job_class: type[Queueable],
    items: Sequence[tuple[Sequence[Any], Mapping[str, Any]]],
    wait: timedelta | float | None,
    at: datetime | None,
    queue: str | None,
    priority: int | None,
    chain: tuple[str, int, str] | None,
    many: bool,
) -> tuple[list[InsertRow], list[tuple[list[Any], dict[str, Any]]]]:
    """Validate a dispatch and build its rows (no database access)."""
    if not is_registered(job_class):
        raise TypeError(
            f"{job_class.__qualname__} is not a registered job (an abstract base?); "
            "dispatch a concrete subclass"
        )
    queue = validation.validate_queue(job_class.queue if queue is None else queue)
    priority = validation.validate_priority(job_class.priority if priority is None else priority)
    run_at = validation.resolve_when(wait=wait, at=at)
    chain_id, chain_position, chain_json = chain if chain else (None, None, None)
    limit = conf.max_payload_bytes()
    rows = []
    payloads = []
    keyer = job_class(queue=queue) if job_class._gator_unique or job_class._gator_keyed else None
    for index, (args, kwargs) in enumerate(items):
        try:
            job_class.check_arguments(args, kwargs)
            args_json, kwargs_json = validation.encode_payload(args, kwargs, limit)
            unique_key = None
            flow_key = limits.flow_key(job_class, keyer, args, kwargs)
            if keyer is not None and job_class._gator_unique:
                unique_key = validation.validate_unique_key(
                    keyer.unique_key(*args, **kwargs), job_class.name
                )
        except (TypeError, ValueError) as exc:
            if many:
                exc.args = (f"dispatch_many() item {index}: {exc}", *exc.args[1:])
            raise
        rows.append(
            InsertRow(
                name=job_class.name,
                args=args_json,
                kwargs=kwargs_json,
                queue=queue,
                priority=priority,
                run_at=run_at,
                chain_id=chain_id,
                chain_position=chain_position,
                chain=chain_json,
                unique_key=unique_key,
                concurrency_key=flow_key,
            )
        )
        payloads.append((list(args), dict(kwargs)))
    return rows, payloads


def _store(
    job_class: type[Queueable],
    rows: list[InsertRow],
    payloads: list[tuple[list[Any], dict[str, Any]]],
    on_commit: bool | str | None,
) -> list[Job]:
    """Insert validated rows now, or once the caller's transaction commits."""
    if not rows:
        return []
    member_of = current_batch()  # a dispatch inside `with Batch(...)` joins the batch
    if member_of is not None:
        member_of.check_room(len(rows))
    if on_commit is None:
        on_commit = conf.dispatch_on_commit()
    alias = conf.database()
    jobs = [
        _unsaved(alias, row, args, kwargs)
        for row, (args, kwargs) in zip(rows, payloads, strict=True)
    ]
    if on_commit:
        commit_alias = DEFAULT_DB_ALIAS if on_commit is True else str(on_commit)
        if connections[commit_alias].in_atomic_block:
            if member_of is not None:
                member_of.deferred_to(commit_alias)
            deferred.defer(
                job_class,
                alias,
                rows,
                jobs,
                commit_alias,
                write=lambda: _write(job_class, alias, rows, jobs, member_of),
                announce=lambda created: _announce(job_class, alias, rows, jobs, created),
            )
        else:
            # Autocommit: Django runs the callback now, and its error reaches the caller.
            transaction.on_commit(
                lambda: _insert(job_class, alias, rows, jobs, member_of), using=commit_alias
            )
    else:
        _insert(job_class, alias, rows, jobs, member_of)
    return jobs


_FIELDS = [f.attname for f in Job._meta.concrete_fields]
#: A waiting job's field values before the dispatch fills in its own (attname: value).
_BLANK: dict[str, Any] = dict.fromkeys(_FIELDS)
_BLANK.update(
    {
        "state": JobState.WAITING.value,
        "attempts": 0,
        "rescues": 0,
        "snoozes": 0,
        "last_error": "",
        "cancel_requested": False,
        "suspect": False,
        "isolated": False,
        "crashes": 0,
    }
)
_new_job = Job.__new__
_new_state = ModelState.__new__


def _unsaved(alias: str, row: InsertRow, args: list[Any], kwargs: dict[str, Any]) -> Job:
    """The Job a dispatch returns, before its INSERT has filled in id and timestamps.

    Built without ``Model.__init__`` (so without pre_init/post_init signals): ten times
    faster, which matters for dispatch_many of thousands of rows."""
    values = dict(_BLANK)
    values["name"] = row.name
    values["args"] = args
    values["kwargs"] = kwargs
    values["queue"] = row.queue
    values["priority"] = row.priority
    values["next_execution_at"] = row.run_at
    if row.chain_id:
        values["chain_id"] = uuid.UUID(row.chain_id)
    values["chain_position"] = row.chain_position
    if row.chain is not None:
        values["chain"] = json.loads(row.chain)
    values["unique_key"] = row.unique_key
    values["batch_id"] = row.batch_id
    values["concurrency_key"] = row.concurrency_key
    job = _new_job(Job)
    job.__dict__ = values
    state = _new_state(ModelState)
    state.db = alias
    job._state = state
    return job


def _insert(
    job_class: type[Queueable],
    alias: str,
    rows: list[InsertRow],
    jobs: list[Job],
    member_of: Batch | None = None,
) -> None:
    created = _write(job_class, alias, rows, jobs, member_of)
    _announce(job_class, alias, rows, jobs, created)


def _write(
    job_class: type[Queueable],
    alias: str,
    rows: list[InsertRow],
    jobs: list[Job],
    member_of: Batch | None = None,
) -> list[Job]:
    """The INSERT, in a dispatch span when OpenTelemetry is installed (see tracing)."""
    write = lambda: _write_members(job_class, alias, rows, jobs, member_of)  # noqa: E731
    return list(tracing.traced_dispatch(job_class.name, rows[0].queue, alias, write))


def _write_members(
    job_class: type[Queueable],
    alias: str,
    rows: list[InsertRow],
    jobs: list[Job],
    member_of: Batch | None,
) -> list[Job]:
    """The INSERT: fills in the returned jobs; returns those it created (a unique job that
    already existed takes that job's values and is not in the list). Members of a batch
    are counted into it in the same transaction."""
    if member_of is not None:
        with transaction.atomic(using=alias):
            batch_id = member_of.admit(alias, len(rows))
            for row, job in zip(rows, jobs, strict=True):
                row.batch_id = job.batch_id = batch_id
            if member_of.step_of is not None:
                # Members of a workflow's batch step: their ends settle the step.
                workflow_id, position = member_of.step_of
                for row, job in zip(rows, jobs, strict=True):
                    row.chain_id, row.chain_position = workflow_id.hex, position
                    job.chain_id, job.chain_position = workflow_id, position
            return _write_rows(job_class, alias, rows, jobs)
    return _write_rows(job_class, alias, rows, jobs)


def _write_rows(
    job_class: type[Queueable], alias: str, rows: list[InsertRow], jobs: list[Job]
) -> list[Job]:
    due_now = {row.queue for row in rows if row.run_at is None}
    engine = get_engine(alias)
    if not job_class._gator_unique:
        returned = engine.insert_jobs(rows, notify=due_now)
        for job, (job_id, created_at, next_execution_at) in zip(jobs, returned, strict=True):
            _saved(job, job_id, created_at, next_execution_at)
        created = jobs
    else:
        created = []
        existing: dict[int, list[Job]] = {}
        for job, (job_id, created_at, next_at, new) in zip(
            jobs, _insert_unique(job_class, engine, rows, due_now), strict=True
        ):
            if new:
                _saved(job, job_id, created_at, next_at)
                created.append(job)
            else:
                existing.setdefault(job_id, []).append(job)
        if existing:
            # "Dispatch returns the existing job": the objects handed out take its values.
            for row in Job.objects.using(alias).filter(pk__in=list(existing)):
                for job in existing[row.pk]:
                    job.__dict__.update({name: getattr(row, name) for name in _FIELDS})
                    job._state.adding = False
    if due_now and created:
        wakeup.after_commit(alias, due_now)  # SQLite, MariaDB: a datagram to idle workers
    return created


def _announce(
    job_class: type[Queueable],
    alias: str,
    rows: list[InsertRow],
    jobs: list[Job],
    created: list[Job],
) -> None:
    """What follows an INSERT: job_dispatched, the log line, GATOR_IMMEDIATE's run."""
    if not created:
        return
    signals.send(signals.job_dispatched, job_class, jobs=created)
    if logger.isEnabledFor(logging.INFO):
        first = created[0]
        if len(created) == 1:
            logger.info(
                "Enqueued job id=%s name=%s queue=%s", first.pk, safe(first.name), first.queue
            )
        else:
            logger.info(
                "Enqueued jobs count=%s name=%s queue=%s first_id=%s",
                len(created),
                safe(first.name),
                first.queue,
                first.pk,
            )
    if conf.immediate():
        # Jobs dispatched with wait= or at= are left for run_jobs() and its clock.
        created_ids = {id(job) for job in created}
        due = [
            job.pk
            for job, row in zip(jobs, rows, strict=True)
            if id(job) in created_ids and row.run_at is None
        ]
        if due:
            immediate.after_commit(alias, lambda: immediate.run_immediately(alias, due))


#: Tries of a unique dispatch in a transaction of its own that the database ends to break a
#: deadlock (MariaDB/MySQL; see MySQLEngine.unique_lookup_lock).
DEADLOCK_TRIES = 10
#: Longest pause between two of those tries, in seconds (random, doubling up to this).
DEADLOCK_MAX_PAUSE = 0.5


def _insert_unique(
    job_class: type[Queueable], engine: Engine, rows: list[InsertRow], notify: set[str]
) -> list[tuple[int, datetime, datetime, bool]]:
    """engine.insert_unique(), run again after a deadlock when the transaction is ours.

    Inside the caller's atomic() block it is not: InnoDB rolled back the caller's whole
    transaction, which only the caller can run again, so the error says that instead."""
    attempt = 1
    while True:
        in_callers_transaction = engine.connection.in_atomic_block
        try:
            return engine.insert_unique(rows, notify=notify)
        except DatabaseError as exc:
            if not engine.is_deadlock(exc):
                raise
            if in_callers_transaction:
                raise DispatchDeadlock(
                    f"dispatch of {job_class.name!r} inside transaction.atomic() lost a "
                    f"deadlock ({exc}); InnoDB ends the whole transaction to break one, so "
                    "run the atomic block again (dispatch retries deadlocks by itself only "
                    "outside one)"
                ) from exc
            if attempt >= DEADLOCK_TRIES:
                raise
            logger.info(
                "Deadlock in unique dispatch, retrying name=%s try=%s error=%s",
                safe(job_class.name),
                attempt,
                safe(str(exc)),
            )
        time.sleep(random.uniform(0, min(0.01 * 2**attempt, DEADLOCK_MAX_PAUSE)))
        attempt += 1


def _saved(job: Job, job_id: int, created_at: datetime, next_execution_at: datetime) -> None:
    values = job.__dict__  # the fields of a Job are plain attributes (pk is "id")
    values["id"] = job_id
    values["created_at"] = created_at
    values["next_execution_at"] = next_execution_at
    job._state.adding = False
