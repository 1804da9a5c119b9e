"""factory-boy factories for rows the public API cannot reach cheaply.

``JobFactory()`` is a waiting job due now; a trait puts it in another state with the columns
that state implies (the ``gator_job_running_is_reserved`` constraint holds for every trait)::

    JobFactory(running=True)                 # claimed just now by FACTORY_WORKER
    JobFactory(lost=True)                    # running, claimed an hour ago by a worker with no row
    JobFactory(failed=True, attempts=5)      # five failed attempts, retry due in a minute
    JobFactory(dead=True), JobFactory(succeeded=True), JobFactory(cancelled=True)
    JobFactory(scheduled=True)               # waiting, due in an hour
    WorkerFactory(), WorkerFactory(stale=True)

``claimed_job(7)`` is a ClaimedJob as a claim hands it to the worker, without a row, for
tests of the worker's parts that need none.

Rows are written through the ORM, so they are only as valid as the model's constraints.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import factory
from django.utils import timezone
from factory.django import DjangoModelFactory

from django_gator.models import Job, JobState, Worker
from django_gator.rows import ClaimedJob

#: The worker id the ``running``/``succeeded``/``failed``/``dead`` traits claim with.
FACTORY_WORKER = "factory-host:1:worker"
#: The job name rows get by default: a registered job that does nothing.
DEFAULT_JOB_NAME = "tests.testapp.jobs.Noop"


def claimed_job(job_id: int = 1, **fields: Any) -> ClaimedJob:
    """A claimed job (first attempt, queue ``default``, no arguments) with ``fields`` set."""
    values: dict[str, Any] = {
        "id": job_id,
        "name": DEFAULT_JOB_NAME,
        "args": [],
        "kwargs": {},
        "queue": "default",
        "priority": 0,
        "attempts": 1,
        "rescues": 0,
    }
    values.update(fields)
    return ClaimedJob(**values)


def error_history(attempts: int, worker: str = FACTORY_WORKER) -> list[dict[str, Any]]:
    """One error-history entry per attempt, shaped like the worker's (see execution.py)."""
    return [
        {
            "attempt": attempt,
            "at": datetime.now(UTC).isoformat(),
            "worker": worker,
            "class": "RuntimeError",
            "message": f"attempt {attempt} failed",
            "traceback": f"Traceback (most recent call last):\nRuntimeError: attempt {attempt}",
        }
        for attempt in range(1, attempts + 1)
    ]


def _ago(**delta: float) -> Any:
    return factory.LazyFunction(lambda: timezone.now() - timedelta(**delta))


def _later(**delta: float) -> Any:
    return factory.LazyFunction(lambda: timezone.now() + timedelta(**delta))


_claimed = {
    "attempts": 1,
    "reserved_by": FACTORY_WORKER,
    "locked_at": _ago(seconds=1),
    "started_at": _ago(seconds=1),
}
_with_errors = {
    "errors": factory.LazyAttribute(lambda o: error_history(o.attempts, o.reserved_by)),
    "last_error": factory.LazyAttribute(lambda o: f"RuntimeError: attempt {o.attempts} failed"),
}


class JobFactory(DjangoModelFactory):
    class Meta:
        model = Job

    class Params:
        scheduled = factory.Trait(next_execution_at=_later(hours=1))
        running = factory.Trait(state=JobState.RUNNING, **_claimed)
        lost = factory.Trait(
            state=JobState.RUNNING,
            attempts=1,
            reserved_by=factory.Sequence(lambda n: f"lost-host:{n}:worker"),
            locked_at=_ago(hours=1),
            started_at=_ago(hours=1),
        )
        succeeded = factory.Trait(
            state=JobState.SUCCEEDED, finished_at=factory.LazyFunction(timezone.now), **_claimed
        )
        failed = factory.Trait(
            state=JobState.FAILED, next_execution_at=_later(minutes=1), **_claimed, **_with_errors
        )
        dead = factory.Trait(
            state=JobState.DEAD,
            finished_at=factory.LazyFunction(timezone.now),
            **_claimed,
            **_with_errors,
        )
        cancelled = factory.Trait(
            state=JobState.CANCELLED, finished_at=factory.LazyFunction(timezone.now)
        )

    name = DEFAULT_JOB_NAME
    args = factory.LazyFunction(list)
    kwargs = factory.LazyFunction(dict)
    queue = "default"
    priority = 0
    state = JobState.WAITING
    attempts = 0
    created_at = factory.LazyFunction(timezone.now)
    next_execution_at = factory.LazyAttribute(lambda o: o.created_at)


class WorkerFactory(DjangoModelFactory):
    class Meta:
        model = Worker

    class Params:
        stale = factory.Trait(heartbeat_at=_ago(hours=1), started_at=_ago(hours=2))

    id = factory.Sequence(lambda n: f"factory-host:{1000 + n}:worker")
    hostname = "factory-host"
    pid = factory.Sequence(lambda n: 1000 + n)
    queues = factory.LazyFunction(list)
    concurrency = 1
    started_at = factory.LazyFunction(timezone.now)
    heartbeat_at = factory.LazyFunction(timezone.now)
