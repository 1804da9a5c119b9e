"""Workflow statements: inserting a workflow, and releasing or cancelling its steps in the
transaction that writes a step's final state (see :mod:`django_gator.models.settling`)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import transaction
from django.utils import timezone

from django_gator import limits, validation
from django_gator.engines.deadlocks import retrying_deadlocks
from django_gator.engines.dispatching import DispatchStatements
from django_gator.exceptions import JobNotRegistered
from django_gator.models.batches import Batch
from django_gator.models.settling import FinishedStep, Settled, settle
from django_gator.models.waits import signal_waiting
from django_gator.models.workflows import WorkflowRun, WorkflowStep
from django_gator.registry import get_job_class
from django_gator.rows import InsertRow
from django_gator.states import StepState

T = TypeVar("T")
logger = logging.getLogger("django_gator.worker")


class WorkflowStatements(DispatchStatements):
    """Workflows' writes. Every path that gives a step's job its final state (a success,
    a failure to dead, a cancellation, a rescue) runs through :meth:`with_steps`."""

    def with_steps(
        self, job_ids: Sequence[int], inserted: list[int] | None, write: Callable[[], T]
    ) -> T:
        """Run ``write`` (a write that may end some of ``job_ids`` in a final state) and,
        if it wrote, settle the workflow steps among them in the same transaction. The ids
        of the rows it inserts (released steps, an on_error handler) go to ``inserted``.
        With no ids, just ``write()``: ordinary jobs pay nothing."""
        if not job_ids:
            return write()

        def write_and_settle() -> T:
            # Django's atomic(), not write_transaction(): the settling uses the ORM, which
            # on SQLite cannot join a transaction opened on the cursor. The write comes
            # first, so SQLite's write lock is taken before anything is read.
            with transaction.atomic(using=self.alias):
                written = write()
                if written:
                    self._settle_steps(job_ids, inserted)
            return written

        # InnoDB may end one of two transactions that lock the same steps in another
        # order; ours is run again from the start (the write is a compare-and-set, so
        # running it again is safe). In a caller's transaction, only the caller can.
        return retrying_deadlocks(self, write_and_settle, "a workflow step's end")

    def _settle_steps(self, job_ids: Sequence[int], inserted: list[int] | None = None) -> None:
        """Inside an open transaction: release or cancel what follows the steps among
        ``job_ids`` that reached a final state (exactly once; a step settled already is
        left alone)."""
        finished = self.finished_steps(job_ids)
        self._insert_settled(settle(self.alias, job_ids, finished=finished), inserted)

    def finished_steps(self, job_ids: Sequence[int]) -> list[FinishedStep] | None:
        """Inside the transaction whose write just ended some of ``job_ids``: those rows
        that are workflow steps in a final state, for :func:`settle`; None lets it read
        them with the ORM (the PostgreSQL engine reads them its own way on partitioned
        storage)."""
        return None

    def _insert_settled(self, settled: Settled, inserted: list[int] | None) -> None:
        """Insert what ``settled`` asks for, in the open transaction: the job of each
        released step (for a batch step, its batch and its members) and the on_error
        handlers; the released steps record their job or batch."""
        rows: list[InsertRow] = []
        counts = []
        batches: dict[int, Batch] = {}
        for step in settled.release:
            if step.members is None:
                row = _step_row(step)
                # A sleep's or a wait's job is due when it ends; a wait whose signal came
                # already, now.
                waited = bool(step.wait_for) and signal_waiting(self.alias, step)
                row.run_at = None if waited else step_due(step.delay, step.due_at, None)
                rows.append(row)
                counts.append(1)
                continue
            batch = step_batch(step.workflow, step.position, step.name)
            batch.size = len(step.members)
            batch.save(using=self.alias, force_insert=True)
            batches[step.pk] = batch
            rows += [_step_row(step, args, kwargs, batch.pk) for args, kwargs in step.members]
            counts.append(len(step.members))
        rows += [_handler_row(*handler) for handler in settled.handlers]
        if not rows:
            return
        ids = [row[0] for row in self.insert_jobs(rows, notify={row.queue for row in rows})]
        steps = WorkflowStep.objects.using(self.alias)
        first = 0
        for step, count in zip(settled.release, counts, strict=True):
            released = steps.filter(pk=step.pk, state=StepState.BLOCKED)
            if step.pk in batches:
                released.update(state=StepState.RELEASED, batch_id=batches[step.pk].pk, members=[])
            else:
                released.update(state=StepState.RELEASED, job_id=ids[first])
            first += count
        if inserted is not None:
            inserted += ids

    def insert_workflow(
        self,
        run: WorkflowRun,
        steps: Sequence[WorkflowStep],
        roots: Sequence[InsertRow],
        batches: Mapping[int, Batch] | None = None,
        members: Mapping[int, Sequence[InsertRow]] | None = None,
    ) -> list[tuple[int, datetime, datetime]]:
        """Insert the workflow, its steps, the job rows of its first steps (``roots``, one
        per step with no dependency, in the order of ``steps``), and the batch and the
        members of each first batch step (``batches`` and ``members``, by position), in one
        transaction (the caller's, if one is open). Returns insert_jobs()'s answer for the
        roots, then for the members in the order of ``members``."""
        batches = batches or {}
        members = members or {}
        rows = [*roots, *(row for position in members for row in members[position])]
        due_now = {r.queue for r in rows if r.run_at is None}
        with transaction.atomic(using=self.alias):  # an INSERT first (see with_steps)
            for position, batch in batches.items():
                batch.save(using=self.alias, force_insert=True)
                for row in members[position]:
                    row.batch_id = batch.pk
            inserted = self.insert_jobs(rows, notify=due_now)
            ids = [r[0] for r in inserted]
            run.save(using=self.alias, force_insert=True)
            by_position = dict(zip((row.chain_position for row in roots), ids, strict=False))
            for step in steps:
                if step.position in by_position:
                    step.state = StepState.RELEASED
                    step.job_id = by_position[step.position]
                elif step.position in batches:
                    step.state = StepState.RELEASED
                    step.batch_id = batches[step.position].pk
            WorkflowStep.objects.using(self.alias).bulk_create(steps, batch_size=500)
        return inserted


def step_batch(run: WorkflowRun, position: int, name: str) -> Batch:
    """The (unsaved) batch of a workflow's batch step: closed from the start (a running
    member may still add members, see Batch.admit), without callbacks (the workflow's
    steps are what follows it)."""
    title = run.name or f"workflow {run.id}"
    return Batch(description=f"{title}: step {position} ({name})"[:255], closed=True)


def step_due(
    delay: float | None, due_at: datetime | None, run_at: datetime | None
) -> datetime | None:
    """When the job of a step released at ``run_at`` (None: now) is due: later by its
    ``delay`` (a sleep, a wait's timeout), or at its ``due_at`` (a sleep until a moment)."""
    if delay is None and due_at is None:
        return run_at
    start = run_at or timezone.now()
    due = start + timedelta(seconds=delay) if delay is not None else start
    return max(due, due_at) if due_at is not None else due


def step_row(
    workflow_id: str,
    position: int,
    name: str,
    args_json: str,
    kwargs_json: str,
    queue: str,
    priority: int,
    run_at: datetime | None = None,
    concurrency_key: str | None = None,
) -> InsertRow:
    """The job row of a workflow's step: its ``chain_id`` is the workflow's id, its
    ``chain_position`` the step's position."""
    return InsertRow(
        name=name,
        args=args_json,
        kwargs=kwargs_json,
        queue=queue,
        priority=priority,
        run_at=run_at,
        chain_id=workflow_id,
        chain_position=position,
        concurrency_key=concurrency_key,
    )


def _step_row(
    step: WorkflowStep, args: Any = None, kwargs: Any = None, batch_id: int | None = None
) -> InsertRow:
    """The job row of a released step; for a batch step, of the member with ``args`` and
    ``kwargs`` in batch ``batch_id``."""
    if batch_id is None:
        args, kwargs = step.args, step.kwargs
    row = step_row(
        step.workflow_id.hex,
        step.position,
        step.name,
        validation.dumps(args),
        validation.dumps(kwargs),
        step.queue,
        step.priority,
        concurrency_key=_flow_key(step.name, step.queue, args, kwargs),
    )
    row.batch_id = batch_id
    return row


def _flow_key(name: str, queue: str, args: Any, kwargs: Any) -> str | None:
    """The concurrency key of a released step or handler (see limits.flow_key). If the
    class is not registered, or its concurrency_key() fails now, the row is inserted
    without one (held to no class limit) rather than lost, and the error is logged."""
    try:
        job_class = get_job_class(name)
        keyer = job_class(queue=queue) if job_class.traits.is_keyed else None
        return limits.flow_key(job_class, keyer, args, kwargs)
    except JobNotRegistered:
        return None
    except Exception:
        logger.exception("concurrency_key() failed for a workflow step job=%s", name)
        return None


def _handler_row(name: str, workflow_id: uuid.UUID, job_id: int) -> InsertRow:
    """The on_error job of a workflow, for its step whose job ``job_id`` ended dead."""
    try:
        job_class = get_job_class(name)
        queue, priority = job_class.queue, job_class.priority
    except JobNotRegistered:
        # Inserted anyway: the worker marks it dead with a clear error; nothing is dropped.
        queue, priority = "default", 0
    args = [str(workflow_id), job_id]
    return InsertRow(
        name=name,
        args=validation.dumps(args),
        kwargs="{}",
        queue=queue,
        priority=priority,
        run_at=None,
        concurrency_key=_flow_key(name, queue, args, {}),
    )
