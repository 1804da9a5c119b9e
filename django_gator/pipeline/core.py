"""The steps every insert of jobs takes after its rows are built, whatever made them (a
dispatch, a dispatch_many, a batch's members, a chain, a workflow): now or at the caller's
commit (retried there, reported if lost), in a dispatch span, the engine's INSERT, the
wakeup of idle workers, then ``job_dispatched`` and the log line. An :class:`Insert` says
what its rows are and how the engine writes them; :func:`submit` runs the steps."""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from django_gator import conf, tracing
from django_gator.engines import JobEngine, get_engine
from django_gator.pipeline import deferred

if TYPE_CHECKING:
    from django_gator.models import Job
    from django_gator.queueable import Queueable


class Insert(abc.ABC):
    """The rows of one insert, built and checked, and what the pipeline's steps need of
    them. Subclasses: :class:`~django_gator.pipeline.jobs.JobsInsert` (the rows of one
    dispatch call) and :class:`~django_gator.pipeline.workflow.WorkflowInsert`."""

    #: The jobs database alias.
    alias: str
    #: The job class that signals name as their sender.
    sender: type[Queueable]
    #: The name and queue the dispatch span and the log lines give.
    name: str
    queue: str
    #: The Job objects returned to the caller: unsaved until the INSERT fills them in.
    jobs: list[Job]

    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of job rows."""
        raise NotImplementedError

    @abc.abstractmethod
    def prepare(self) -> None:
        """Build :attr:`jobs` if they are not built yet (idempotent)."""
        raise NotImplementedError

    def defer(self, commit_alias: str) -> None:
        """The insert will wait for ``commit_alias``'s commit: refuse a bad row now and
        build the jobs now (they are returned now, and filled in on commit)."""
        self.prepare()

    @abc.abstractmethod
    def write(self, engine: JobEngine) -> list[Job]:
        """The engine's INSERT; returns the jobs it created (a unique job that existed
        already is not among them)."""
        raise NotImplementedError

    @abc.abstractmethod
    def announce(self, created: list[Job]) -> None:
        """``job_dispatched``, the log line and GATOR_IMMEDIATE's run, after the INSERT."""
        raise NotImplementedError

    def lost(self) -> Iterable[tuple[type[Queueable], list[Job]]]:
        """The jobs of a deferred insert that was given up on, by job class, for
        ``dispatch_failed`` (each class's jobs once)."""
        return [(self.sender, self.jobs)]

    def payloads(self) -> Iterable[tuple[str, Any, Any]]:
        """(name, args, kwargs) of every row, to mask their secrets in a logged error."""
        return ((job.name, job.args, job.kwargs) for job in self.jobs)

    @abc.abstractmethod
    def report_lost(self, tries: int, error_text: str) -> None:
        """Log, at ERROR and with secrets masked, what re-creates the rows a deferred insert
        gave up on."""
        raise NotImplementedError


def submit(insert: Insert, on_commit: bool | str | None) -> list[Job]:
    """Run the pipeline for ``insert``: now, inside the caller's transaction on the jobs
    database if one is open; or, with ``on_commit`` (True for the default alias, or an alias
    name; None: GATOR_DISPATCH_ON_COMMIT) inside an open transaction there, once it commits
    (retried, and reported if lost: see deferred). Returns ``insert.jobs``."""
    if on_commit is None:
        on_commit = conf.dispatch_on_commit()
    if not on_commit:
        insert_now(insert)
        return insert.jobs
    commit_alias = DEFAULT_DB_ALIAS if on_commit is True else str(on_commit)
    if connections[commit_alias].in_atomic_block:
        insert.defer(commit_alias)
        deferred.defer(insert, commit_alias, write=lambda: write(insert), announce=insert.announce)
    else:
        # Autocommit: Django runs the callback now, and its error reaches the caller.
        transaction.on_commit(lambda: insert_now(insert), using=commit_alias)
    return insert.jobs


def insert_now(insert: Insert) -> None:
    """The INSERT and what follows it, in the current transaction (or autocommit)."""
    insert.announce(write(insert))


def write(insert: Insert) -> list[Job]:
    """The engine's INSERT in a dispatch span (see tracing), which wakes the idle workers
    of the queues it made due (``notify``: PostgreSQL's NOTIFY rides in the INSERT's
    transaction; elsewhere a datagram is sent once the transaction commits)."""
    engine = get_engine(insert.alias)
    return list(
        tracing.traced_dispatch(
            insert.name, insert.queue, insert.alias, lambda: insert.write(engine)
        )
    )
