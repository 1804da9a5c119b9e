"""Chains: run jobs one after another, each only after the previous one succeeded.

``Chain(FetchData, ProcessData, NotifyUser).dispatch(order_id)`` inserts the first step now.
When a step succeeds, the worker inserts the next step in the same transaction that marks
the step succeeded, so there is no moment at which a step is done and its successor lost.
Every step gets the chain's arguments. A step that fails is retried by its own policy; a
step that ends ``dead`` stops the chain, and the chain's ``on_error`` job (if any) is
dispatched with ``(chain_id, job_id)`` of the dead step, in the transaction that marks it
dead.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django_gator import limits, validation
from django_gator.exceptions import JobNotRegistered
from django_gator.queueable import JobFunction, Queueable, resolve_job_class
from django_gator.registry import get_job_class
from django_gator.rows import ClaimedJob, InsertRow

if TYPE_CHECKING:
    from django_gator.models import Job

logger = logging.getLogger("django_gator.worker")


class Chain:
    """A sequence of jobs that run one after another with the same arguments."""

    def __init__(
        self,
        *steps: type[Queueable] | JobFunction,
        on_error: type[Queueable] | JobFunction | None = None,
    ) -> None:
        if not steps:
            raise ValueError("a Chain needs at least one job")
        self.steps = [resolve_job_class(step) for step in steps]
        self.on_error = resolve_job_class(on_error) if on_error is not None else None
        if self.on_error is not None:
            self.on_error.check_arguments(["chain-id", 1], {})

    def __repr__(self) -> str:
        return "Chain(" + ", ".join(step.name for step in self.steps) + ")"

    def dispatch(
        self,
        *args: Any,
        wait: timedelta | float | None = None,
        at: datetime | None = None,
        queue: str | None = None,
        priority: int | None = None,
        on_commit: bool | str | None = None,
        **kwargs: Any,
    ) -> Job:
        """Insert the first step; returns its Job row (its ``chain_id`` names the chain)."""
        # Here, not at the top: dispatch imports the models, and `import django_gator`
        # (which imports this module) must not. Not an import cycle.
        from django_gator.dispatch import enqueue

        for step in self.steps[1:]:
            step.check_arguments(args, kwargs)  # fail now, not halfway through the chain
        if queue is not None:
            validation.validate_queue(queue)
        if priority is not None:
            validation.validate_priority(priority)
        spec = {
            "steps": [step.name for step in self.steps],
            "queue": queue,
            "priority": priority,
            "on_error": self.on_error.name if self.on_error else None,
        }
        return enqueue(
            self.steps[0],
            [(args, kwargs)],
            wait=wait,
            at=at,
            queue=queue,
            priority=priority,
            on_commit=on_commit,
            chain=(uuid.uuid4().hex, 0, validation.dumps(spec)),
        )[0]


def next_step(job: ClaimedJob) -> InsertRow | None:
    """The row of the step after ``job`` in its chain, or None if ``job`` was the last."""
    spec = _spec(job)
    steps = spec.get("steps") or []
    position = (job.chain_position or 0) + 1
    if position >= len(steps):
        return None
    return _row(job, steps[position], spec, position, job.args, job.kwargs)


def error_handler(job: ClaimedJob) -> InsertRow | None:
    """The row of the chain's ``on_error`` job for a step that ended dead, if it has one."""
    spec = _spec(job)
    name = spec.get("on_error")
    if not name:
        return None
    return _row(job, name, {}, None, [str(job.chain_id), job.id], {})


def _spec(job: ClaimedJob) -> dict[str, Any]:
    spec = job.chain
    return spec if isinstance(spec, dict) else {}


def _row(
    job: ClaimedJob,
    name: str,
    spec: dict[str, Any],
    position: int | None,
    args: Sequence[Any],
    kwargs: dict[str, Any],
) -> InsertRow:
    key = None
    try:
        job_class = get_job_class(name)
        queue, priority = job_class.queue, job_class.priority
    except JobNotRegistered:
        # Inserted anyway: the worker will mark it dead with a clear error, and nothing of
        # the chain is silently dropped.
        queue, priority = "default", 0
    else:
        key = _flow_key(job_class, spec.get("queue") or queue, args, kwargs)
    chain_id = job.chain_id.hex if isinstance(job.chain_id, uuid.UUID) else job.chain_id
    return InsertRow(
        name=name,
        args=validation.dumps(list(args)),
        kwargs=validation.dumps(dict(kwargs)),
        queue=spec.get("queue") or queue,
        priority=spec["priority"] if spec.get("priority") is not None else priority,
        run_at=None,
        chain_id=chain_id if position is not None else None,
        chain_position=position,
        chain=validation.dumps(spec) if position is not None else None,
        concurrency_key=key,
    )


def _flow_key(
    job_class: Any, queue: str, args: Sequence[Any], kwargs: dict[str, Any]
) -> str | None:
    """The step's concurrency key; if its concurrency_key() fails, the step is inserted
    without one (held to no class limit) rather than lost, and the error is logged."""
    try:
        return limits.flow_key(job_class, job_class(queue=queue), args, kwargs)
    except Exception:
        logger.exception("concurrency_key() failed for a chain step job=%s", job_class.name)
        return None
