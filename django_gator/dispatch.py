"""Enqueueing: validate, insert in the caller's transaction, wake workers on commit."""

from __future__ import annotations

import functools
import itertools
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.models.base import ModelState

from django_gator import (
    collector,
    conf,
    deferred,
    immediate,
    limits,
    signals,
    tracing,
    validation,
    wakeup,
)
from django_gator.engines import Engine, get_engine
from django_gator.exceptions import DispatchDeadlock
from django_gator.logutil import safe
from django_gator.models import Batch, Job, JobState
from django_gator.models.batches import current_batch
from django_gator.registry import is_registered
from django_gator.rows import Inserted, InsertRow, JobRows

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
) -> tuple[JobRows, tuple[list[list[Any]], list[dict[str, Any]]]]:
    """Validate a dispatch and build its rows (no database access); returns them with the
    arguments as the returned jobs will hold them (copies of the caller's)."""
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
    with collector.paused(len(items)):
        args_col = [list(args) for args, _ in items]
        kwargs_col = [dict(kwargs) if kwargs else {} for _, kwargs in items]
        encode = None
        if (
            many
            and len(items) >= STREAM_MIN_ROWS
            and not (job_class._gator_limited or job_class._gator_unique)
            and not job_class.misfits(args_col, kwargs_col)
        ):
            # Checked and encoded as an engine that streams the rows sends them (see
            # JobRows.encode): the checks overlap the database's work on the rows sent.
            # "" (never JSON) until encoded; without keyword arguments, every row's "{}".
            args_json: list[str] = [""] * len(items)
            keywords = any(kwargs_col)
            kwargs_json = [""] * len(items) if keywords else ["{}"] * len(items)
            encode = functools.partial(
                _encode_range,
                args_col,
                kwargs_col,
                limit,
                args_json,
                kwargs_json if keywords else None,
            )
        else:
            args_json, kwargs_json = _payloads(job_class, args_col, kwargs_col, limit, many)
        rows = JobRows(
            name=job_class.name,
            queue=queue,
            priority=priority,
            run_at=run_at,
            args=args_json,
            kwargs=kwargs_json,
            chain_id=chain_id,
            chain_position=chain_position,
            chain=chain_json,
            encode=encode,
        )
        if job_class._gator_limited or job_class._gator_unique:
            _keys(job_class, queue, rows, args_col, kwargs_col, many)
    return rows, (args_col, kwargs_col)


#: A dispatch_many of at least this many items whose arguments all fit handle() has their
#: JSON checked and encoded while the rows are sent, on engines that stream them
#: (PostgreSQL's COPY), instead of before (see JobRows.encode).
STREAM_MIN_ROWS = 2000


def _encode_range(
    args_col: list[list[Any]],
    kwargs_col: list[dict[str, Any]],
    limit: int,
    args_json: list[str],
    kwargs_json: list[str] | None,
    start: int,
    stop: int,
) -> None:
    """Check and encode the arguments of items ``start`` to ``stop`` (whose shapes fit
    handle(): see _rows) into ``args_json`` and ``kwargs_json`` (None: no item has keyword
    arguments); raises for the first bad one, its message naming its index in the whole
    dispatch_many."""
    with collector.paused(stop - start):
        chunk_args, chunk_kwargs = args_col[start:stop], kwargs_col[start:stop]
        encoded_args, encoded_kwargs, doubtful = validation.encode_columns(
            chunk_args, chunk_kwargs, limit
        )
        for index in doubtful:
            try:
                encoded_args[index], encoded_kwargs[index] = validation.encode_payload(
                    chunk_args[index], chunk_kwargs[index], limit
                )
            except (TypeError, ValueError) as exc:
                _name_item(exc, start + index, True)
                raise
        args_json[start:stop] = encoded_args
        if kwargs_json is not None:
            kwargs_json[start:stop] = encoded_kwargs


def _payloads(
    job_class: type[Queueable],
    args_col: list[list[Any]],
    kwargs_col: list[dict[str, Any]],
    limit: int,
    many: bool,
) -> tuple[list[str], list[str]]:
    """Check that each item's arguments fit handle() and are JSON; returns their JSON. The
    checks run a column at a time (see validation.encode_columns and Queueable.misfits);
    the items they cannot clear at once are checked one by one, in order, so the error
    raised is the one of the first bad item, as if every item had been checked in turn. A
    single item is checked as it is."""
    if len(args_col) == 1:
        try:
            job_class.check_arguments(args_col[0], kwargs_col[0])
            args_json, kwargs_json = validation.encode_payload(args_col[0], kwargs_col[0], limit)
        except (TypeError, ValueError) as exc:
            _name_item(exc, 0, many)
            raise
        return [args_json], [kwargs_json]
    misfits = job_class.misfits(args_col, kwargs_col)
    args_col_json, kwargs_col_json, doubtful = validation.encode_columns(
        args_col, kwargs_col, limit
    )
    if misfits or doubtful:
        misfit = set(misfits)
        for index in sorted(misfit.union(doubtful)):
            args, kwargs = args_col[index], kwargs_col[index]
            try:
                if index in misfit:
                    job_class.check_arguments(args, kwargs)  # raises
                args_col_json[index], kwargs_col_json[index] = validation.encode_payload(
                    args, kwargs, limit
                )
            except (TypeError, ValueError) as exc:
                _name_item(exc, index, many)
                raise
    return args_col_json, kwargs_col_json


def _keys(
    job_class: type[Queueable],
    queue: str,
    rows: JobRows,
    args_col: list[list[Any]],
    kwargs_col: list[dict[str, Any]],
    many: bool,
) -> None:
    """The rows' unique keys and flow-control keys, from the class's methods."""
    keyer = job_class(queue=queue) if job_class._gator_unique or job_class._gator_keyed else None
    unique_keys: list[str | None] = []
    flow_keys: list[str | None] = []
    for index, (args, kwargs) in enumerate(zip(args_col, kwargs_col, strict=True)):
        try:
            flow_keys.append(limits.flow_key(job_class, keyer, args, kwargs))
            if keyer is not None and job_class._gator_unique:
                unique_keys.append(
                    validation.validate_unique_key(
                        keyer.unique_key(*args, **kwargs), job_class.name
                    )
                )
        except (TypeError, ValueError) as exc:
            _name_item(exc, index, many)
            raise
    if job_class._gator_limited:
        rows.concurrency_keys = flow_keys
    if unique_keys:
        rows.unique_keys = unique_keys


def _name_item(exc: Exception, index: int, many: bool) -> None:
    """Prefix the message of ``exc`` with the item's index, for dispatch_many."""
    if many:
        exc.args = (f"dispatch_many() item {index}: {exc}", *exc.args[1:])


def _store(
    job_class: type[Queueable],
    rows: JobRows,
    payloads: tuple[list[list[Any]], list[dict[str, Any]]],
    on_commit: bool | str | None,
) -> list[Job]:
    """Insert validated rows now, or once the caller's transaction commits."""
    if not len(rows):
        return []
    member_of = current_batch()  # a dispatch inside `with Batch(...)` joins the batch
    if member_of is not None:
        member_of.check_room(len(rows))
    if on_commit is None:
        on_commit = conf.dispatch_on_commit()
    alias = conf.database()
    jobs: list[Job] = []

    def prepare() -> None:
        """The jobs to return, built while the database stores the rows (see _write_rows)."""
        with collector.paused(len(rows)):
            jobs.extend(_unsaved_jobs(alias, rows, *payloads))

    if on_commit:
        commit_alias = DEFAULT_DB_ALIAS if on_commit is True else str(on_commit)
        if connections[commit_alias].in_atomic_block:
            rows.settle()  # a bad item is refused now, not at the commit
            prepare()  # the jobs are returned now, and filled in on commit
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
                lambda: _insert(job_class, alias, rows, jobs, member_of, prepare),
                using=commit_alias,
            )
    else:
        _insert(job_class, alias, rows, jobs, member_of, prepare)
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


def _template(
    name: str,
    queue: str,
    priority: int,
    run_at: datetime | None,
    chain_id: str | None,
    chain_position: int | None,
    batch_id: int | None,
) -> dict[str, Any]:
    """The field values the jobs of one dispatch call share."""
    values = dict(_BLANK)
    values["name"] = name
    values["queue"] = queue
    values["priority"] = priority
    values["next_execution_at"] = run_at
    if chain_id:
        values["chain_id"] = uuid.UUID(chain_id)
    values["chain_position"] = chain_position
    values["batch_id"] = batch_id
    return values


def _unsaved(alias: str, row: InsertRow, args: list[Any], kwargs: dict[str, Any]) -> Job:
    """The Job a dispatch returns, before its INSERT has filled in id and timestamps.

    Built without ``Model.__init__`` (so without pre_init/post_init signals): ten times
    faster, which matters for dispatch_many of thousands of rows."""
    values = _template(
        row.name,
        row.queue,
        row.priority,
        row.run_at,
        row.chain_id,
        row.chain_position,
        row.batch_id,
    )
    values["args"] = args
    values["kwargs"] = kwargs
    if row.chain is not None:
        values["chain"] = json.loads(row.chain)
    values["unique_key"] = row.unique_key
    values["concurrency_key"] = row.concurrency_key
    return _job(values, alias)


def _job(values: dict[str, Any], alias: str) -> Job:
    job = _new_job(Job)
    state = _new_state(ModelState)
    state.db = alias
    values["_state"] = state
    job.__dict__ = values
    return job


def _unsaved_jobs(
    alias: str, rows: JobRows, args_col: list[list[Any]], kwargs_col: list[dict[str, Any]]
) -> list[Job]:
    """:func:`_unsaved` for every row of one dispatch call: the shared values are set
    once, and each Job gets a copy of them and its own arguments and keys."""
    template = _template(
        rows.name,
        rows.queue,
        rows.priority,
        rows.run_at,
        rows.chain_id,
        rows.chain_position,
        rows.batch_id,
    )
    count = len(rows)
    unique_keys = rows.unique_keys or itertools.repeat(None, count)
    flow_keys = rows.concurrency_keys or itertools.repeat(None, count)
    jobs: list[Job] = []
    append = jobs.append
    new_job, new_state, job_class = _new_job, _new_state, Job
    for args, kwargs, unique_key, concurrency_key in zip(
        args_col, kwargs_col, unique_keys, flow_keys, strict=True
    ):
        state = new_state(ModelState)
        state.db = alias
        job = new_job(job_class)
        job.__dict__ = {
            **template,
            "args": args,
            "kwargs": kwargs,
            "unique_key": unique_key,
            "concurrency_key": concurrency_key,
            "_state": state,
        }
        append(job)
    if rows.chain is not None:  # a list each: a Job's fields are its own
        for job in jobs:
            job.chain = json.loads(rows.chain)
    return jobs


def _insert(
    job_class: type[Queueable],
    alias: str,
    rows: JobRows,
    jobs: list[Job],
    member_of: Batch | None = None,
    prepare: Callable[[], None] | None = None,
) -> None:
    created = _write(job_class, alias, rows, jobs, member_of, prepare)
    _announce(job_class, alias, rows, jobs, created)


def _write(
    job_class: type[Queueable],
    alias: str,
    rows: JobRows,
    jobs: list[Job],
    member_of: Batch | None = None,
    prepare: Callable[[], None] | None = None,
) -> list[Job]:
    """The INSERT, in a dispatch span when OpenTelemetry is installed (see tracing)."""
    write = lambda: _write_members(job_class, alias, rows, jobs, member_of, prepare)  # noqa: E731
    return list(tracing.traced_dispatch(job_class.name, rows.queue, alias, write))


def _write_members(
    job_class: type[Queueable],
    alias: str,
    rows: JobRows,
    jobs: list[Job],
    member_of: Batch | None,
    prepare: Callable[[], None] | None,
) -> list[Job]:
    """The INSERT: fills in the returned jobs; returns those it created (a unique job that
    already existed takes that job's values and is not in the list). Members of a batch
    are counted into it in the same transaction."""
    if member_of is not None:
        with transaction.atomic(using=alias):
            batch_id = member_of.admit(alias, len(rows))
            rows.batch_id = batch_id  # jobs built from here on take it from the rows
            step_of = member_of.step_of
            if step_of is not None:
                # Members of a workflow's batch step: their ends settle the step.
                rows.chain_id, rows.chain_position = step_of[0].hex, step_of[1]
            for job in jobs:  # new objects: no related Batch is cached to invalidate
                job.__dict__["batch_id"] = batch_id
                if step_of is not None:
                    job.chain_id, job.chain_position = step_of
            return _write_rows(job_class, alias, rows, jobs, prepare)
    return _write_rows(job_class, alias, rows, jobs, prepare)


def _write_rows(
    job_class: type[Queueable],
    alias: str,
    rows: JobRows,
    jobs: list[Job],
    prepare: Callable[[], None] | None,
) -> list[Job]:
    """The INSERT and the returned jobs' ids. ``prepare`` (None when ``jobs`` are built
    already) builds them, and ``fill`` gives them their ids: both are handed to the
    engine, which runs them where the database is busy (a large COPY: while it draws
    the ids from the sequence, and while it reads the last lines)."""
    due_now = {rows.queue} if rows.run_at is None else set()
    engine = get_engine(alias)
    if job_class._gator_unique or not engine.streams_rows(len(rows)):
        rows.settle()
    if not job_class._gator_unique:

        def fill(inserted: Inserted) -> None:
            for job, job_id, made_at, next_at in zip(jobs, *inserted, strict=True):
                values = job.__dict__  # as _saved(), without a call per job
                values["id"] = job_id
                values["created_at"] = made_at
                values["next_execution_at"] = next_at
                values["_state"].adding = False

        engine.insert_rows(rows, notify=due_now, prepare=prepare, meanwhile=fill)
        created = jobs
    else:
        if prepare is not None:
            prepare()
        created = []
        existing: dict[int, list[Job]] = {}
        for job, (job_id, created_at, next_at, new) in zip(
            jobs, _insert_unique(job_class, engine, rows.rows(), due_now), strict=True
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
    rows: JobRows,
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
    # Jobs dispatched with wait= or at= are left for run_jobs() and its clock.
    if conf.immediate() and rows.run_at is None:
        due = [job.pk for job in created]
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
    transaction, and on PostgreSQL the caller's transaction still holds the locks that
    made the cycle (only our savepoint was rolled back), so trying again would deadlock
    again. Only the caller can run its block again, and the error says so."""
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
                    f"deadlock ({exc}); the database broke it by rolling back the dispatch "
                    "(InnoDB: the whole transaction), so run the atomic block again (dispatch "
                    "retries deadlocks by itself only outside one)"
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
