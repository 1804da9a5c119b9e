"""Chains: run jobs one after another, each only after the previous one succeeded.

``Chain(FetchData, ProcessData, NotifyUser).dispatch(order_id)`` is a
:class:`~django_gator.workflows.Workflow` whose steps form a line, each step getting the
chain's arguments. The first step's job is inserted now; each next one when the previous
succeeds, in the transaction that marks it succeeded, so there is no moment at which a
step is done and its successor lost. A step that fails is retried by its own policy; a
step that ends ``dead`` cancels the rest of the chain, and the chain's ``on_error`` job
(if any) is dispatched with ``(chain_id, job_id)`` of the dead step, in the transaction
that marks it dead. A job's ``chain_id`` is its workflow's id.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django_gator.jobfunction import JobFunction, resolve_job_class
from django_gator.queueable import Queueable
from django_gator.workflows import Step, Workflow

if TYPE_CHECKING:
    from django_gator.models import Job


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

    def workflow(self, *args: Any, **kwargs: Any) -> Workflow:
        """The workflow this chain dispatches with these arguments."""
        workflow = Workflow(repr(self)[:200], on_error=self.on_error)
        previous: Step | None = None
        for job_class in self.steps:
            after: list[Step] = [previous] if previous is not None else []
            previous = workflow.add_step(job_class, args, kwargs, after=after)
        return workflow

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
        """Insert the chain; returns its first step's Job row (its ``chain_id`` names the
        chain's workflow)."""
        workflow = self.workflow(*args, **kwargs)
        workflow.dispatch(wait=wait, at=at, queue=queue, priority=priority, on_commit=on_commit)
        first = workflow.steps[0].job
        assert first is not None
        return first

    async def adispatch(
        self,
        *args: Any,
        wait: timedelta | float | None = None,
        at: datetime | None = None,
        queue: str | None = None,
        priority: int | None = None,
        on_commit: bool | str | None = None,
        **kwargs: Any,
    ) -> Job:
        """:meth:`dispatch` for async code, validated before its INSERT goes to a thread
        (see :meth:`Workflow.adispatch`)."""
        workflow = self.workflow(*args, **kwargs)
        await workflow.adispatch(
            wait=wait, at=at, queue=queue, priority=priority, on_commit=on_commit
        )
        first = workflow.steps[0].job
        assert first is not None
        return first
