"""The jobs of a workflow's sleep and wait steps (``Workflow.add_sleep``,
``Workflow.add_wait``): internal job classes, registered under ``gator.sleep`` and
``gator.wait``, whose rows are inserted when the step is released, due when it ends.

A sleep's job is due ``delay`` seconds after its release (or at its ``at``) and does
nothing: the wait costs a row, no thread, and survives restarts like any scheduled job.
A wait's job is due at its deadline (or made due by its signal, see
:mod:`django_gator.models.waits`): it returns the signal's payload, or at the deadline
runs the ``on_timeout`` job class in its place (called with the workflow's id and the
signal's name; its result is the wait's), or ends dead with
:class:`~django_gator.exceptions.WaitTimedOut`.
"""

from __future__ import annotations

from typing import Any

from django_gator.databases import for_queue
from django_gator.exceptions import WaitRejected, WaitTimedOut
from django_gator.queueable import Queueable
from django_gator.registry import get_job_class
from django_gator.states import SLEEP_JOB, WAIT_JOB

#: The deadline of a wait without a timeout: far enough never to come.
NO_TIMEOUT_SECONDS = 100 * 365 * 24 * 3600.0


class SleepStep(Queueable):
    """A workflow's sleep step: due when the sleep ends; succeeds at once."""

    name = SLEEP_JOB

    def handle(self) -> None:
        return None


class WaitStep(Queueable):
    """A workflow's wait step: see the module's docstring. Not retried: a timeout is
    final, and a signal found is a success."""

    name = WAIT_JOB

    def handle(self, signal: str, on_timeout: str = "") -> Any:
        from django_gator.models.waits import delivered  # see cancel_requested

        workflow_id, entry = delivered(for_queue(self.queue), self.job_id, signal)
        if entry is not None and entry.get("rejected"):
            note = (entry.get("payload") or {}).get("note", "")
            raise WaitRejected(
                f"workflow {workflow_id}: the wait for {signal!r} was rejected by "
                f"{entry.get('by') or 'someone'} at {entry.get('at')}"
                + (f": {note}" if note else "")
            )
        if entry is not None:
            return entry.get("payload")
        if on_timeout:
            handler = get_job_class(on_timeout)(
                job_id=self.job_id, attempt=self.attempt, queue=self.queue
            )
            return handler.handle(workflow_id, signal)
        raise WaitTimedOut(
            f"workflow {workflow_id}: the signal {signal!r} did not come before the wait's timeout"
        )
