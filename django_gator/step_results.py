"""What a workflow step's job reads with ``self.results()``: the results of the steps it
comes after, by step name (a chain's job: the previous job's).

Read when the job asks, from the rows: its own job row gives its workflow and position,
its step row the positions it comes after, their step rows their names and jobs, and
those jobs' rows their results (a batch step's: its members' results, in the order they
were added). Three or four indexed reads, made only by a job that calls it. A result an
encrypted job class stored sealed is opened here (see :mod:`django_gator.encryption`).
"""

from __future__ import annotations

from typing import Any

from django_gator import conf
from django_gator.encryption import open_value


def parent_results(job_id: int | None, alias: str | None = None) -> dict[str, Any]:
    """``{step name: result}`` of the steps the job ``job_id`` comes after; empty for a job
    outside a workflow, a first step, or no job (run outside a worker). A parent that
    returned nothing, or ended dead under ``on_dead="continue"``, gives None; so does one
    whose job row was pruned since (see GATOR_PRUNE_SUCCEEDED_AFTER). ``alias``: the job's
    database (default GATOR_DATABASE)."""
    from django_gator.models import Job, WorkflowStep

    if job_id is None:
        return {}
    alias = alias or conf.database()
    jobs = Job.objects.using(alias)
    where = jobs.filter(pk=job_id).values_list("chain_id", "chain_position").first()
    if where is None or where[0] is None or where[1] is None:
        return {}
    workflow_id, position = where[0], int(where[1])
    steps = WorkflowStep.objects.using(alias).filter(workflow_id=workflow_id)
    after = steps.filter(position=position).values_list("after", flat=True).first()
    if not after:
        return {}
    parents = list(
        steps.filter(position__in=after)
        .order_by("position")
        .values_list("position", "label", "job_id", "batch_id", "members")
    )
    singles = [job for _, _, job, _, members in parents if members is None and job is not None]
    results = dict(jobs.filter(pk__in=singles).values_list("pk", "result")) if singles else {}
    results = {pk: open_value(value, f"the result of job {pk}") for pk, value in results.items()}
    out: dict[str, Any] = {}
    for parent, label, job, batch_id, members in parents:
        name = label or str(parent)
        if members is None:
            out[name] = None if job is None else results.get(job)
        elif batch_id is None:
            out[name] = []
        else:
            members_results = jobs.filter(batch_id=batch_id).order_by("pk")
            out[name] = [
                open_value(value, f"a result of batch {batch_id}")
                for value in members_results.values_list("result", flat=True)
            ]
    return out
