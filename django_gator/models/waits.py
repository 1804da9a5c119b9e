"""What a wait step's job reads when it runs (:func:`delivered`), and the release of a
wait step whose signal came first (:func:`signal_waiting`); the signals themselves are
sent by ``WorkflowRun.signal`` (:func:`django_gator.models.workflows.send_signal`).

A wait step is a step whose job (``gator.wait``, see :mod:`django_gator.workflow_waits`)
is due at the wait's deadline (or, without a timeout, far in the future). A signal is
recorded on the workflow's row, under a lock of that row, once: a second one of the same
name is reported, not applied. If the wait's job exists and waits, it is made due now, so
a worker runs it at its next claim: it finds the signal and returns the payload, which
the steps after it read with ``self.results()``. A signal that comes before the wait step
is released is kept; the release finds it (under the same lock) and inserts the wait's job
due now. A wait's job that runs at its deadline without a signal takes ``on_timeout`` or
ends dead (:class:`~django_gator.exceptions.WaitTimedOut`).
"""

from __future__ import annotations

from typing import Any

from django_gator.models.jobs import Job
from django_gator.models.workflows import WorkflowRun, WorkflowStep


def delivered(alias: str, job_id: int | None, name: str) -> tuple[str | None, Any]:
    """For the job of a wait step: (its workflow's id as text, the signal's entry: payload,
    at, by, and ``rejected`` for a rejection); the entry is None while no signal has come.
    Two reads by primary key."""
    if job_id is None:
        return None, None
    workflow_id = (
        Job.objects.using(alias).filter(pk=job_id).values_list("chain_id", flat=True).first()
    )
    if workflow_id is None:
        return None, None
    signals = (
        WorkflowRun.objects.using(alias)
        .filter(pk=workflow_id)
        .values_list("signals", flat=True)
        .first()
    )
    return str(workflow_id), (signals or {}).get(name)


def signal_waiting(alias: str, step: WorkflowStep) -> bool:
    """At the release of a wait step, in the releasing transaction: whether its signal
    came already (the workflow's row locked first, so that a signal sent meanwhile either
    committed before, and is seen, or waits for this transaction and then finds the
    wait's job to make due)."""
    signals = (
        WorkflowRun.objects.using(alias)
        .select_for_update()
        .filter(pk=step.workflow_id)
        .values_list("signals", flat=True)
        .first()
    )
    return bool(signals) and step.wait_for in (signals or {})
