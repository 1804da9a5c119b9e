"""Inserting a checked workflow (:meth:`django_gator.workflows.Workflow.dispatch`): its
row, its steps' rows and the job rows of the steps that wait for nothing (for a batch
step, its batch and its members), in one transaction, now or when the caller's transaction
commits."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from django_gator import conf, immediate, signals
from django_gator.dispatch import _saved, _unsaved
from django_gator.engines import get_engine
from django_gator.engines.workflows import step_batch, step_row
from django_gator.logutil import safe
from django_gator.models import Batch, Job, WorkflowRun, WorkflowStep
from django_gator.registry import is_registered
from django_gator.rows import InsertRow

if TYPE_CHECKING:
    from django_gator.workflows import StepSpec

logger = logging.getLogger("django_gator.dispatch")


def dispatch_workflow(
    name: str,
    on_error: str,
    specs: Sequence[StepSpec],
    *,
    run_at: datetime | None,
    on_commit: bool | str | None,
) -> tuple[WorkflowRun, dict[int, Job], dict[int, Batch]]:
    """Insert the workflow; returns its row, the Job rows of its first steps and the Batch
    rows of its first batch steps, by position (filled in once inserted, as dispatch's
    are)."""
    for spec in specs:
        if not is_registered(spec.job_class):
            raise TypeError(
                f"step {spec.position}: {spec.job_class.__qualname__} is not a registered "
                "job (an abstract base?); use a concrete subclass"
            )
    alias = conf.database()
    run = WorkflowRun(id=uuid.uuid4(), name=name, on_error=on_error)
    children: dict[int, list[int]] = {spec.position: [] for spec in specs}
    for spec in specs:
        for parent in spec.after:
            children[parent].append(spec.position)
    steps = []
    roots: list[InsertRow] = []
    root_jobs: dict[int, Job] = {}
    members: dict[int, list[InsertRow]] = {}
    batches: dict[int, Batch] = {}
    for spec in specs:
        args, kwargs = spec.values()
        stored = None
        if spec.members is not None:
            # A first batch step's members are inserted now; a later one's wait in its row.
            stored = [] if not spec.after else [[m.args, m.kwargs] for m in spec.members]
        steps.append(
            WorkflowStep(
                workflow=run,
                position=spec.position,
                name=spec.job_class.name,
                args=args,
                kwargs=kwargs,
                queue=spec.queue,
                priority=spec.priority,
                after=spec.after,
                children=children[spec.position],
                waiting_on=len(spec.after),
                on_dead=spec.on_dead,
                members=stored,
            )
        )
        if spec.after:
            continue
        if spec.members is not None:
            members[spec.position] = [
                step_row(
                    run.id.hex,
                    spec.position,
                    spec.job_class.name,
                    member.args_json,
                    member.kwargs_json,
                    spec.queue,
                    spec.priority,
                    run_at,
                    concurrency_key=member.concurrency_key,
                )
                for member in spec.members
            ]
            batches[spec.position] = step_batch(run, spec.position, spec.job_class.name)
            batches[spec.position].size = len(spec.members)
            continue
        row = step_row(
            run.id.hex,
            spec.position,
            spec.job_class.name,
            spec.args_json,
            spec.kwargs_json,
            spec.queue,
            spec.priority,
            run_at,
            concurrency_key=spec.concurrency_key,
        )
        roots.append(row)
        root_jobs[spec.position] = _unsaved(alias, row, args, kwargs)

    def write() -> None:
        engine = get_engine(alias)
        inserted = engine.insert_workflow(run, steps, roots, batches, members)
        for job, (job_id, created_at, next_execution_at) in zip(
            root_jobs.values(), inserted, strict=False
        ):
            _saved(job, job_id, created_at, next_execution_at)
        ids = [r[0] for r in inserted]
        by_class = {spec.position: spec.job_class for spec in specs}
        for position, job in root_jobs.items():
            signals.send(signals.job_dispatched, by_class[position], jobs=[job])
        first = len(roots)
        for position, rows in members.items():
            job_class = by_class[position]
            if signals.job_dispatched.has_listeners(job_class):
                jobs = []
                for row, (job_id, created_at, next_at) in zip(
                    rows, inserted[first : first + len(rows)], strict=True
                ):
                    job = _unsaved(alias, row, json.loads(row.args), json.loads(row.kwargs))
                    _saved(job, job_id, created_at, next_at)
                    jobs.append(job)
                signals.send(signals.job_dispatched, job_class, jobs=jobs)
            first += len(rows)
        logger.info(
            "Enqueued workflow id=%s name=%s steps=%s first_ids=%s%s",
            run.id,
            safe(name),
            len(steps),
            ",".join(map(str, ids[: len(roots)])) or "-",
            "".join(f" batch={b.pk}" for b in batches.values()),
        )
        if conf.immediate() and run_at is None:
            immediate.after_commit(alias, lambda: immediate.run_immediately(alias, ids))

    if on_commit is None:
        on_commit = conf.dispatch_on_commit()
    if on_commit:
        commit_alias = DEFAULT_DB_ALIAS if on_commit is True else str(on_commit)
        if connections[commit_alias].in_atomic_block:
            transaction.on_commit(write, using=commit_alias)
            return run, root_jobs, batches
    write()
    return run, root_jobs, batches
