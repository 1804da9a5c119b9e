"""Batches: a group of jobs whose end dispatches callbacks (fan-out, fan-in).

A member is a job whose ``batch_id`` names the batch. The batch's row holds its callbacks
(registered job names), whether it is closed, and which completion it has answered:
``generation`` grows when a retry brings a dead member of a completed batch back, and
``completed_generation`` records the completion whose callbacks were dispatched, so each
completion dispatches ``on_complete`` once. The callbacks are inserted by
:mod:`django_gator.engines.batching`, in the transaction of the outcome that completes the
batch; this module cannot call it (the engines sit above the models), so the app's
``ready()`` installs it (:mod:`.membership`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from django.db import models, transaction
from django.utils import timezone

from django_gator import conf
from django_gator.databases import for_queue
from django_gator.exceptions import CrossDatabase, JobNotRegistered
from django_gator.models import membership
from django_gator.models.job_queries import JobQuerySet
from django_gator.models.jobs import Job
from django_gator.models.pruning import Prunable
from django_gator.registry import get_job_class, is_registered
from django_gator.states import ACTIVE_STATES, JobState
from django_gator.validation import NAME_MAX_LENGTH

if TYPE_CHECKING:
    from datetime import datetime

    from django_gator.queueable import Queueable

#: The batch that dispatches join (the innermost ``with Batch(...)`` block).
_current: ContextVar[Batch | None] = ContextVar("django_gator_batch", default=None)

CALLBACKS = ("on_success", "on_complete", "on_dead")


def current_batch() -> Batch | None:
    """The batch that a dispatch made now joins, if any."""
    return _current.get()


def callback_name(field: str, value: Any) -> str:
    """The registered job name of callback ``value`` (a job class or a registered name);
    "" for None. TypeError naming the value otherwise."""
    if value is None or value == "":
        return ""
    if isinstance(value, type):
        if is_registered(value):
            return str(value.name)  # type: ignore[attr-defined]
        raise TypeError(f"Batch {field}={value.__qualname__} is not a registered job class")
    if isinstance(value, str):
        try:
            get_job_class(value)
        except JobNotRegistered as exc:
            raise TypeError(f"Batch {field}={value!r}: {exc}") from exc
        return value
    raise TypeError(f"Batch {field}={value!r} is not a job class: pass a registered job class")


class BatchError(ValueError):
    """A batch refused a dispatch, or refused to close."""


class BatchQuerySet(Prunable, models.QuerySet["Batch"]):
    prune_order = ("id",)

    def finished(self, *, before: datetime | None = None) -> BatchQuerySet:
        """Closed, completed batches none of whose members is left (each was pruned, past
        its own retention); with ``before``, only those completed before it. A batch with
        a member left, dead ones included (a retry may re-open it), is never among them."""
        rows = self.filter(closed=True, completed_at__isnull=False).exclude(
            models.Exists(Job.objects.filter(batch_id=models.OuterRef("pk")))
        )
        return rows if before is None else rows.filter(completed_at__lt=before)


class Batch(models.Model):
    """A group of jobs; when every member has ended, the callbacks are dispatched.

    ::

        with Batch(on_success=PublishAlbum, on_complete=NotifyOwner) as batch:
            ResizeImage.dispatch(image_id)      # every dispatch in the block joins

    ``on_complete`` runs once when every member has ended (succeeded, dead or cancelled),
    ``on_success`` once when all of them succeeded, ``on_dead`` once when a member first
    ends dead. Each receives the batch id as its first argument.
    """

    id = models.BigAutoField(primary_key=True)
    description = models.CharField(max_length=255, blank=True, default="")
    on_success = models.CharField(max_length=NAME_MAX_LENGTH, blank=True, default="")
    on_complete = models.CharField(max_length=NAME_MAX_LENGTH, blank=True, default="")
    on_dead = models.CharField(max_length=NAME_MAX_LENGTH, blank=True, default="")
    closed = models.BooleanField(default=False, help_text="No member can join any more.")
    size = models.PositiveIntegerField(default=0, help_text="Members dispatched into it.")
    generation = models.PositiveIntegerField(
        default=1, help_text="Grows when a retry re-opens a completed batch."
    )
    completed_generation = models.PositiveIntegerField(
        default=0, help_text="The generation whose completion dispatched the callbacks."
    )
    success_dispatched = models.BooleanField(default=False)
    dead_dispatched = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)
    completed_at = models.DateTimeField(null=True, blank=True)

    objects = BatchQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "batches"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        for field in CALLBACKS:
            if field in kwargs:
                kwargs[field] = callback_name(field, kwargs[field])
        super().__init__(*args, **kwargs)
        self._token: Any = None
        self._deferred_close: str | None = None
        #: The running member this object was handed to (see of_member()).
        self._member: int | None = None
        #: A workflow's batch step: (workflow id, position), which its members carry.
        self.step_of: tuple[uuid.UUID, int] | None = None
        #: (alias, queue) of the first members dispatched into it before it has a row.
        self._home: tuple[str, str] | None = None

    def __str__(self) -> str:
        return f"batch #{self.pk or '-'} {self.description}".strip()

    # -- joining -----------------------------------------------------------------------
    def __enter__(self) -> Batch:
        self._token = _current.set(self)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        _current.reset(self._token)
        self._token = None
        if exc_type is None:
            if self._deferred_close is not None:
                # Members wait for that alias's commit; the close follows them.
                transaction.on_commit(self.close, using=self._deferred_close)
            else:
                self.close()

    @contextmanager
    def joined(self) -> Iterator[Batch]:
        """Dispatches inside join this batch (without closing it at the end)."""
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)

    def add(self, job_class: type[Queueable], *args: Any, **kwargs: Any) -> Job:
        """Dispatch ``job_class(*args, **kwargs)`` as a member (``dispatch`` options such
        as ``queue=`` or ``wait=`` are accepted); the batch must not be closed."""
        with self.joined():
            return job_class.dispatch(*args, **kwargs)

    def add_many(self, job_class: type[Queueable], items: Any, **options: Any) -> list[Job]:
        """``job_class.dispatch_many(items, ...)`` as members."""
        with self.joined():
            return job_class.dispatch_many(items, **options)

    def deferred_to(self, commit_alias: str) -> None:
        """A member's INSERT waits for ``commit_alias``'s commit (dispatch on_commit)."""
        self._deferred_close = commit_alias

    @classmethod
    def of_member(cls, job_id: int, alias: str | None = None) -> Batch | None:
        """The batch of job ``job_id``, or None if it is in none, for the job itself to add
        members while it runs (``self.batch()`` in handle()): a closed batch accepts them
        then, since it cannot complete while this member is active. Members added to a
        workflow's batch step belong to that step."""
        alias = alias or conf.database()
        row = (
            Job.objects.using(alias)
            .filter(pk=job_id)
            .values_list("batch_id", "chain_id", "chain_position")
            .first()
        )
        if row is None or row[0] is None:
            return None
        batch = cls.objects.using(alias).filter(pk=row[0]).first()
        if batch is None:
            return None
        batch._member = job_id
        if row[1] is not None and row[2] is not None:
            batch.step_of = (row[1], row[2])
        return batch

    def check_room(self, count: int) -> None:
        """BatchError, before anything is written, if ``count`` more members would not fit
        (as far as this object knows; admit() checks the row)."""
        if self.closed and self._member is None:
            raise BatchError(f"{self} is closed: no job can join it")
        limit = conf.max_batch_size()
        if self.size + count > limit:
            raise BatchError(
                f"{self} would have {self.size + count} members, more than "
                f"GATOR_MAX_BATCH_SIZE = {limit}; nothing was dispatched"
            )

    def check_database(self, alias: str, queue: str) -> None:
        """CrossDatabase, before anything is written, if members of ``queue`` (whose jobs
        live in the database ``alias``) would join a batch that lives in another one: a
        batch, its members and its callbacks live within one job database."""
        if self.pk is not None and self._state.db is not None:
            home, first = self._state.db, None
        elif self._home is not None:
            home, first = self._home
        else:
            self._check_callbacks(alias)
            self._home = (alias, queue)
            return
        if home == alias:
            return
        where = f"{home!r}" if first is None else f"{home!r} (its first members' queue {first!r})"
        raise CrossDatabase(
            f"{self} lives in the job database {where}, but queue {queue!r} is routed to "
            f"{alias!r} (GATOR_QUEUE_DATABASES): a batch lives within one database; nothing "
            "was dispatched"
        )

    def _check_callbacks(self, alias: str) -> None:
        """CrossDatabase if a callback's queue lives in another database than ``alias``
        (the callbacks are dispatched in the batch's database when it completes)."""
        if not conf.get("GATOR_QUEUE_DATABASES"):
            return
        for field in CALLBACKS:
            name = getattr(self, field)
            if not name:
                continue
            queue = get_job_class(name).queue
            if for_queue(queue) != alias:
                raise CrossDatabase(
                    f"{self}'s {field} job {name!r} runs on queue {queue!r}, routed to "
                    f"{for_queue(queue)!r} (GATOR_QUEUE_DATABASES), but its members go to "
                    f"{alias!r}: a batch lives within one database; nothing was dispatched"
                )

    def admit(self, alias: str, count: int) -> int:
        """Count ``count`` new members in, in the open transaction of ``alias`` (the one
        that inserts them); returns the batch id. The row is created with its first
        members, so a batch that never gets one leaves no row. BatchError, and nothing
        written, if the batch is closed or would exceed GATOR_MAX_BATCH_SIZE."""
        self.check_room(count)
        if self.pk is None:
            self.size = count
            self.save(using=alias, force_insert=True)
            return int(self.pk)
        limit = conf.max_batch_size()
        rows = Batch.objects.using(alias).filter(pk=self.pk, size__lte=limit - count)
        if self._member is None:
            rows = rows.filter(closed=False)
        else:
            # A running member adds to its own batch: the batch stays incomplete while
            # that member is active, so joining it, closed or not, is safe.
            rows = rows.filter(models.Exists(self._active_member(alias)))
        changed = rows.update(size=models.F("size") + count)
        if changed != 1:
            row = Batch.objects.using(alias).filter(pk=self.pk).first()
            if row is None:
                raise BatchError(f"{self} does not exist (deleted?)")
            self.closed, self.size = row.closed, row.size
            self.check_room(count)
            if self._member is not None and not self._active_member(alias).exists():
                raise BatchError(
                    f"job {self._member} is no longer an active member of {self} (it ended, "
                    "or was taken back from its worker): it cannot add members"
                )
            raise BatchError(f"{self} refused {count} members")  # pragma: no cover
        self.size += count
        return int(self.pk)

    def _active_member(self, alias: str) -> JobQuerySet:
        assert self._member is not None
        return Job.objects.using(alias).filter(
            pk=self._member, batch_id=self.pk, state__in=ACTIVE_STATES
        )

    # -- closing -----------------------------------------------------------------------
    def close(self) -> None:
        """No member can join any more; once every member has ended (now, or when the last
        one does), the callbacks are dispatched. BatchError for a batch with no members
        (nothing is written)."""
        alias = self._state.db or conf.database()
        if self.pk is None or self.size == 0:
            raise BatchError(
                f"{self} is empty: dispatch at least one job into it before closing it "
                "(nothing was dispatched)"
            )
        with transaction.atomic(using=alias):
            Batch.objects.using(alias).filter(pk=self.pk).update(closed=True)
            membership.settle(alias, [self.pk])
        self.closed = True

    # -- reading -----------------------------------------------------------------------
    @property
    def members(self) -> JobQuerySet:
        return Job.objects.using(self._state.db or conf.database()).filter(batch_id=self.pk)

    def counts(self) -> dict[str, int]:
        """Members per state (every state, zeros included), and ``total``."""
        out = {state.value: 0 for state in JobState}
        rows = self.members.order_by().values_list("state").annotate(n=models.Count("id"))
        for state, n in rows:
            out[state] = n
        out["total"] = sum(out.values())
        return out

    @property
    def is_complete(self) -> bool:
        return self.completed_generation == self.generation
