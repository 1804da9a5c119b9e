"""A checked workflow (:meth:`django_gator.workflows.Workflow.dispatch`; a chain is one) as
the pipeline inserts it: its row, its steps' rows and the job rows of the steps that wait
for nothing (for a batch step, its batch and its members), in one transaction, now or when
the caller's transaction commits."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django_gator import conf, databases, immediate, redaction, signals
from django_gator.engines.workflows import step_batch, step_due, step_row
from django_gator.logutil import safe
from django_gator.models import Batch, Job, WorkflowRun, WorkflowStep
from django_gator.pipeline import core
from django_gator.pipeline.deferred import log_json
from django_gator.pipeline.unsaved import mark_saved, unsaved_job
from django_gator.registry import get_job_class, is_registered

if TYPE_CHECKING:
    from django_gator.engines import JobEngine
    from django_gator.queueable import Queueable
    from django_gator.rows import InsertRow
    from django_gator.workflow_specs import StepSpec

logger = logging.getLogger("django_gator.dispatch")


def dispatch_workflow(
    name: str,
    on_error: str,
    specs: Sequence[StepSpec],
    *,
    run_at: datetime | None,
    on_commit: bool | str | None,
) -> tuple[WorkflowRun, dict[int, Job], dict[int, Batch]]:
    """Insert the workflow through the pipeline; returns its row, the Job rows of its first
    steps and the Batch rows of its first batch steps, by position (filled in once
    inserted, as dispatch's are)."""
    for spec in specs:
        if not is_registered(spec.job_class):
            raise TypeError(
                f"step {spec.position}: {spec.job_class.__qualname__} is not a registered "
                "job (an abstract base?); use a concrete subclass"
            )
    alias = conf.database()
    if conf.get("GATOR_QUEUE_DATABASES"):
        what = f"workflow {name!r}" if name else "a workflow (or chain)"
        # Its on_error job is dispatched in its database too.
        handler = [get_job_class(on_error).queue] if on_error else []
        alias = databases.one_database(what, [spec.queue for spec in specs] + handler)
        if alias != conf.database():
            databases.check_migrated(alias)
        if on_commit is None and not conf.dispatch_on_commit():
            on_commit = databases.caller_transaction(alias)
    insert = WorkflowInsert(alias, name, on_error, specs, run_at)
    core.submit(insert, on_commit)
    return insert.run, insert.root_jobs, insert.batches


class WorkflowInsert(core.Insert):
    """A workflow's rows: the run, every step, and the job rows of the first steps."""

    def __init__(
        self,
        alias: str,
        name: str,
        on_error: str,
        specs: Sequence[StepSpec],
        run_at: datetime | None,
    ) -> None:
        self.alias = alias
        self.specs = specs
        self.run_at = run_at
        self.run = WorkflowRun(id=uuid.uuid4(), name=name, on_error=on_error)
        self.steps = _steps(self.run, specs)
        self.roots: list[InsertRow] = []
        self.root_jobs: dict[int, Job] = {}
        self.members: dict[int, list[InsertRow]] = {}
        self.batches: dict[int, Batch] = {}
        self.member_jobs: dict[int, list[Job]] = {}
        for spec in specs:
            if not spec.after:
                self._first_step(spec)
        first = next(spec for spec in specs if not spec.after)
        self.sender = first.job_class
        self.name = name or first.job_class.name
        self.queue = first.queue
        self.jobs = list(self.root_jobs.values())

    def _first_step(self, spec: StepSpec) -> None:
        """The rows of a step that waits for nothing: its job's, or its batch's and its
        members' (a later batch step's members wait in its row)."""
        hex_id = self.run.id.hex
        if spec.members is None:
            row = step_row(
                hex_id,
                spec.position,
                spec.job_class.name,
                spec.args_json,
                spec.kwargs_json,
                spec.queue,
                spec.priority,
                step_due(spec.delay, spec.due_at, self.run_at),
                concurrency_key=spec.concurrency_key,
            )
            self.roots.append(row)
            self.root_jobs[spec.position] = unsaved_job(self.alias, row, *spec.values())
            return
        self.members[spec.position] = [
            step_row(
                hex_id,
                spec.position,
                spec.job_class.name,
                member.args_json,
                member.kwargs_json,
                spec.queue,
                spec.priority,
                self.run_at,
                concurrency_key=member.concurrency_key,
            )
            for member in spec.members
        ]
        batch = step_batch(self.run, spec.position, spec.job_class.name)
        batch.size = len(spec.members)
        self.batches[spec.position] = batch

    def __len__(self) -> int:
        return len(self.roots) + sum(map(len, self.members.values()))

    def prepare(self) -> None:
        return None  # the first steps' jobs are built with the rows

    def write(self, engine: JobEngine) -> list[Job]:
        inserted = engine.insert_workflow(
            self.run, self.steps, self.roots, self.batches, self.members
        )
        for job, (job_id, created_at, next_execution_at) in zip(
            self.root_jobs.values(), inserted, strict=False
        ):
            mark_saved(job, job_id, created_at, next_execution_at)
        created = list(self.root_jobs.values())
        first = len(self.roots)
        for position, jobs in self._member_jobs().items():
            for job, answer in zip(jobs, inserted[first : first + len(jobs)], strict=True):
                job.batch_id = self.batches[position].pk
                mark_saved(job, *answer)
            created += jobs
            first += len(jobs)
        return created

    def _member_jobs(self) -> dict[int, list[Job]]:
        """The Job objects of the first batch steps' members, by position."""
        by_position = {spec.position: spec for spec in self.specs}
        for position, rows in self.members.items():
            if position not in self.member_jobs:
                members = by_position[position].members or []
                self.member_jobs[position] = [
                    unsaved_job(self.alias, row, member.args, member.kwargs)
                    for row, member in zip(rows, members, strict=True)
                ]
        return self.member_jobs

    def announce(self, created: list[Job]) -> None:
        by_class = {spec.position: spec.job_class for spec in self.specs}
        for position, job in self.root_jobs.items():
            signals.send(signals.job_dispatched, by_class[position], jobs=[job])
        for position, jobs in self.member_jobs.items():
            signals.send(signals.job_dispatched, by_class[position], jobs=jobs)
        logger.info(
            "Enqueued workflow id=%s name=%s steps=%s first_ids=%s%s",
            self.run.id,
            safe(self.run.name),
            len(self.steps),
            ",".join(str(job.pk) for job in self.root_jobs.values()) or "-",
            "".join(f" batch={b.pk}" for b in self.batches.values()),
        )
        if conf.immediate() and self.run_at is None:
            ids = [job.pk for job in created]
            immediate.after_commit(self.alias, lambda: immediate.run_immediately(self.alias, ids))

    def lost(self) -> Iterable[tuple[type[Queueable], list[Job]]]:
        by_class: dict[type[Queueable], list[Job]] = {}
        members = self._member_jobs()
        for spec in self.specs:
            jobs = [self.root_jobs[spec.position]] if spec.position in self.root_jobs else []
            by_class.setdefault(spec.job_class, []).extend(jobs + members.get(spec.position, []))
        return [(sender, jobs) for sender, jobs in by_class.items() if jobs]

    def payloads(self) -> Iterable[tuple[str, Any, Any]]:
        for spec in self.specs:
            yield (spec.job_class.name, *spec.values())
            for member in spec.members or ():
                yield spec.job_class.name, member.args, member.kwargs

    def report_lost(self, tries: int, error_text: str) -> None:
        logger.error(
            "Deferred dispatch lost: workflow not inserted id=%s name=%s run_at=%s steps=%s "
            "tries=%s error=%s",
            self.run.id,
            log_json(self.run.name),
            self.run_at.isoformat() if self.run_at is not None else "now",
            log_json([_step_for_log(spec) for spec in self.specs]),
            tries,
            error_text,
        )


def _steps(run: WorkflowRun, specs: Sequence[StepSpec]) -> list[WorkflowStep]:
    """The step rows (each blocked on its dependencies; the insert releases the first)."""
    children: dict[int, list[int]] = {spec.position: [] for spec in specs}
    for spec in specs:
        for parent in spec.after:
            children[parent].append(spec.position)
    steps = []
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
                label=spec.label,
                args=args,
                kwargs=kwargs,
                queue=spec.queue,
                priority=spec.priority,
                after=spec.after,
                children=children[spec.position],
                waiting_on=len(spec.after),
                on_dead=spec.on_dead,
                members=stored,
                wait_for=spec.wait_for,
                delay=spec.delay,
                due_at=spec.due_at,
            )
        )
    return steps


def _step_for_log(spec: StepSpec) -> dict[str, Any]:
    """A step as the lost workflow's log line gives it: what re-creates it, secrets
    masked."""
    name = spec.job_class.name
    args, kwargs = redaction.redact_payload(name, *spec.values())
    step: dict[str, Any] = {
        "position": spec.position,
        "name": name,
        "args": args,
        "kwargs": kwargs,
        "queue": spec.queue,
        "priority": spec.priority,
        "after": spec.after,
        "on_dead": spec.on_dead,
    }
    if spec.members is not None:
        step["members"] = [
            list(redaction.redact_payload(name, member.args, member.kwargs))
            for member in spec.members
        ]
    return step
