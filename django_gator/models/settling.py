"""How a step's end moves the steps after it: :func:`settle`, called in the transaction
that writes a step's job's final state.

A step is a row of ``django_gator_workflow_step``. Until its dependencies are satisfied it
is ``blocked`` and has no job row at all, so the claim never reads it and ordinary jobs
are claimed exactly as fast as before. When a step's job reaches a final state, the
transaction that writes that state also calls :func:`settle`, which (under a lock on the
step's row, with a compare-and-set on its state, so exactly once):

- on success (or death of a step marked ``on_dead="continue"``): takes one from the
  ``waiting_on`` counter of each child, and hands back the children it brought to zero,
  to be released (their job rows inserted, by the engine, in the same transaction);
- on death or cancellation: marks every blocked descendant ``cancelled`` with the reason
  (which step ended how), and hands back the workflow's ``on_error`` job, if any.

Two parents finishing at once in two workers both update the child's counter; the
second waits for the first's row lock and then counts down from its committed value, so
exactly one of them sees zero. The read that decides is a locking read, which MariaDB
under REPEATABLE READ needs to see the newest commit.

A batch step (``members`` set) is released as a :class:`~django_gator.models.Batch` of
jobs, each carrying the workflow's id and the step's position as a plain step's job does.
The final state of any member settles the step in the same transaction: under the lock
of the batch's row (which orders the settling of one batch's members, see
:mod:`django_gator.engines.batching`), the members' states are read (an active one, a
dead one, a cancelled one; :mod:`.membership` asks the engine) and the step moves to what
they say: ``succeeded`` when all succeeded, ``dead``/``cancelled`` as soon as one member
ended so (cancelling its descendants, unless ``on_dead="continue"``, where it waits for
the last member and then counts as satisfied), and back to ``released`` when a retried
member succeeded while others still run (what it had cancelled waits again).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import F

from django_gator.models import membership
from django_gator.models.jobs import Job
from django_gator.models.workflows import (
    ON_DEAD_CANCEL,
    ON_DEAD_CONTINUE,
    WorkflowRun,
    WorkflowStep,
)
from django_gator.states import FINAL_STATES, JobState, StepState


@dataclass(slots=True)
class Settled:
    """What the final states settled asks the engine to insert, in the same transaction."""

    #: Steps whose dependencies are now all satisfied (locked, still ``blocked``).
    release: list[WorkflowStep]
    #: (job name, workflow id, job id) of on_error handlers to dispatch.
    handlers: list[tuple[str, uuid.UUID, int]]


#: A finished workflow step's job: (id, workflow id, position, state, batch id).
FinishedStep = tuple[int, uuid.UUID | None, int | None, str, int | None]


def settle(
    alias: str,
    job_ids: Iterable[int],
    states: Sequence[str] = FINAL_STATES,
    finished: Iterable[FinishedStep] | None = None,
) -> Settled:
    """Inside the transaction that wrote the final state of some of ``job_ids``: settle
    the workflow steps among them. Jobs not in a workflow, not final, or already settled
    are left alone, so calling it again (or for jobs that are not steps) is harmless.

    ``finished``: the rows among ``job_ids`` that are steps in one of ``states``, when the
    caller has read them (see WorkflowStatements.finished_steps); else read here."""
    out = Settled([], [])
    ids = list(job_ids)
    if not ids:
        return out
    rows: Iterable[FinishedStep] = (
        finished
        if finished is not None
        else Job.objects.using(alias)
        .filter(pk__in=ids, chain_id__isnull=False, state__in=states)
        .values_list("pk", "chain_id", "chain_position", "state", "batch_id")
        .order_by()  # sorted below (on partitioned storage an ORDER BY plans a merge)
    )
    seen: set[int] = set()
    for job_id, workflow_id, position, state, batch_id in sorted(rows, key=lambda r: r[0]):
        if workflow_id is None or position is None:
            continue
        if batch_id is None:
            _settle_one(alias, job_id, workflow_id, position, state, out)
        elif batch_id not in seen:  # one look at a batch step settles all its members
            seen.add(batch_id)
            _settle_batch_step(alias, workflow_id, position, batch_id, out)
    return out


def _settle_one(
    alias: str, job_id: int, workflow_id: uuid.UUID, position: int, state: str, out: Settled
) -> None:
    steps = WorkflowStep.objects.using(alias).filter(workflow_id=workflow_id)
    step = steps.select_for_update().filter(position=position, job_id=job_id).first()
    if step is None:
        return
    if step.state != StepState.RELEASED and state != JobState.SUCCEEDED:
        return  # settled already (a retried step that ends badly again changes nothing)
    _move(alias, steps, step, state, f"job {job_id}", job_id, out)


def _settle_batch_step(
    alias: str, workflow_id: uuid.UUID, position: int, batch_id: int, out: Settled
) -> None:
    """Move a batch step to what its members' states say (see the module's docstring)."""
    probe = membership.probe(alias, batch_id)  # locks the batch's row first
    if probe is None:
        return
    steps = WorkflowStep.objects.using(alias).filter(workflow_id=workflow_id)
    step = steps.select_for_update().filter(position=position, batch_id=batch_id).first()
    if step is None:
        return
    state: str
    if probe.cancelled or (probe.dead and step.on_dead == ON_DEAD_CANCEL):
        state = StepState.CANCELLED if probe.cancelled and not probe.dead else StepState.DEAD
        member = probe.dead or probe.cancelled
    elif probe.active or not probe.closed:
        state, member = StepState.RELEASED, None
    elif probe.dead:
        state, member = StepState.DEAD, probe.dead
    else:
        state, member = StepState.SUCCEEDED, None
    # A member the engine saw locked (MariaDB) has no id to name here.
    who = f"batch {batch_id}" + (f", job {member}" if member and member > 0 else "")
    _move(alias, steps, step, state, who, member if member and member > 0 else None, out)


def _cancelling(step: WorkflowStep) -> bool:
    """Whether ``step``'s state has cancelled its descendants."""
    return step.state == StepState.CANCELLED or (
        step.state == StepState.DEAD and step.on_dead == ON_DEAD_CANCEL
    )


def _move(
    alias: str,
    steps: Any,
    step: WorkflowStep,
    state: str,
    who: str,
    job_id: int | None,
    out: Settled,
) -> None:
    """Move the locked ``step`` to ``state`` (``released``, or a final state), and do what
    that means for the steps after it. ``who`` names the job (or batch) whose end moved
    it, for the reasons written; ``job_id`` is the job an on_error handler is given."""
    position = step.position
    if state == step.state:
        return
    if step.state == StepState.SUCCEEDED or (
        step.state == StepState.DEAD and step.on_dead == ON_DEAD_CONTINUE
    ):
        # Its children were credited already: only a later success is recorded.
        if state == StepState.SUCCEEDED:
            steps.filter(pk=step.pk).update(state=state, reason="")
        return
    bad = state in (StepState.DEAD, StepState.CANCELLED)
    cancels = state == StepState.CANCELLED or (bad and step.on_dead == ON_DEAD_CANCEL)
    if _cancelling(step):
        if cancels:
            return  # still cancelling what it cancelled; the first reason stays
        # An operator retried what ended it, and now it succeeded (or, for a batch
        # step, the other members still run): what it cancelled waits again (the
        # counters were kept).
        steps.filter(cancelled_by=position, state=StepState.CANCELLED).update(
            state=StepState.BLOCKED, reason="", cancelled_by=None
        )
    verb = "ended dead" if state == StepState.DEAD else "was cancelled"
    reason = f"{who} {verb}" if bad and step.is_batch else ""
    steps.filter(pk=step.pk).update(state=state, reason=reason)
    if state == StepState.RELEASED:
        return
    if not cancels:  # succeeded, or dead with on_dead="continue"
        _credit_children(steps, step, out)
        return
    descendants = _all_descendants(steps, step.children)
    if descendants:
        steps.filter(position__in=descendants, state=StepState.BLOCKED).update(
            state=StepState.CANCELLED,
            reason=f"step {position} ({step.name}, {who}) {verb}",
            cancelled_by=position,
        )
    if state == StepState.DEAD and job_id is not None:
        _add_error_handler(alias, step, job_id, out)


def _credit_children(steps: Any, step: WorkflowStep, out: Settled) -> None:
    """``step`` succeeded (or counts as if): each child waits on one step fewer, and those
    waiting on none are released."""
    if step.children:
        # Counted down whatever the child's state, so that a child cancelled by
        # another step and brought back later has the right count.
        steps.filter(position__in=step.children).update(waiting_on=F("waiting_on") - 1)
        _release_ready(steps, step.children, out)


def _add_error_handler(alias: str, step: WorkflowStep, job_id: int, out: Settled) -> None:
    """The workflow's on_error handler, if it has one, is due for ``step``'s dead job."""
    handler = (
        WorkflowRun.objects.using(alias)
        .filter(pk=step.workflow_id)
        .values_list("on_error", flat=True)
    )
    name = handler.first()
    if name:
        out.handlers.append((name, step.workflow_id, job_id))


def _release_ready(steps: Any, positions: Sequence[int], out: Settled) -> None:
    if positions:
        ready = steps.select_for_update().filter(
            position__in=list(positions), state=StepState.BLOCKED, waiting_on=0
        )
        out.release += list(ready.order_by("position"))


def _all_descendants(steps: Any, children: Sequence[int]) -> list[int]:
    """Positions reachable from ``children`` (one read of the workflow's graph)."""
    if not children:
        return []
    graph = dict(steps.values_list("position", "children"))
    seen: set[int] = set()
    todo = list(children)
    while todo:
        position = todo.pop()
        if position not in seen:
            seen.add(position)
            todo += graph.get(position) or []
    return sorted(seen)


def settle_cancelled(alias: str, job_ids: Iterable[int]) -> None:
    """After an operator's cancellation or discard: settle the steps among ``job_ids``
    that it ended ``cancelled`` (their descendants are cancelled; nothing is released, so
    no job row is inserted). Called in the cancelling transaction."""
    settle(alias, job_ids, states=(JobState.CANCELLED,))
