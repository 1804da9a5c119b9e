"""Celery's eager mode (``task_always_eager``, ``Task.apply()``): the dispatched jobs run
at once in this thread, through the worker's own claim and outcome writes
(:func:`django_gator.worker.inline.run_inline`, as ``GATOR_IMMEDIATE`` and ``run_jobs()``
run them), and a retry runs again at once, as Celery's eager retries do."""

from __future__ import annotations

from django_gator import conf
from django_gator.models import JobState
from django_gator.worker.inline import inline_worker_id, run_inline

#: Most runs one eager dispatch makes (a task that retries for ever stops here).
MAX_RUNS = 10_000


def run_eagerly(job_ids: list[int], *, propagate: bool, alias: str | None = None) -> None:
    """Run these jobs and the jobs their ends lead to (a chain's next steps, a chord's
    callback); with ``propagate`` (``task_eager_propagates``) the error of a job that
    ended dead is raised here, else it waits in its AsyncResult."""
    alias = alias or conf.database()
    worker_id = inline_worker_id()
    todo = list(job_ids)
    runs = 0
    while todo and runs < MAX_RUNS:
        job_id = todo.pop(0)
        outcome = run_inline(alias, job_id, worker_id)
        runs += 1
        if outcome is None:
            continue
        if outcome.state == JobState.FAILED:
            todo.insert(0, job_id)  # Celery's eager retry: again, now
        todo += outcome.follow_ups
        if propagate and outcome.state == JobState.DEAD and outcome.exception is not None:
            raise outcome.exception
