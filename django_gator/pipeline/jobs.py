"""The rows of one dispatch call (``dispatch``, ``dispatch_many``, a batch's ``add``) as
the pipeline inserts them: a batch's members are counted into it in the INSERT's
transaction, unique jobs are inserted or found one by one (after a deadlock, again)."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from django.db import transaction

from django_gator import collector, conf, immediate, redaction, signals
from django_gator.engines.deadlocks import retrying_deadlocks
from django_gator.exceptions import DispatchDeadlock
from django_gator.logutil import safe
from django_gator.models import Job
from django_gator.pipeline.core import Insert
from django_gator.pipeline.deferred import log_json
from django_gator.pipeline.encoding import Payloads
from django_gator.pipeline.unsaved import FIELDS, mark_saved, unsaved_jobs

if TYPE_CHECKING:
    from datetime import datetime

    from django.db import DatabaseError

    from django_gator.engines import JobEngine
    from django_gator.models import Batch
    from django_gator.queueable import Queueable
    from django_gator.rows import Inserted, InsertRow, JobRows

logger = logging.getLogger("django_gator.dispatch")


class JobsInsert(Insert):
    """The rows of one dispatch call, of one job class; ``member_of``: the batch they join."""

    def __init__(
        self,
        job_class: type[Queueable],
        alias: str,
        rows: JobRows,
        payloads: Payloads,
        member_of: Batch | None,
    ) -> None:
        self.sender = job_class
        self.alias = alias
        self.rows = rows
        self.payloads_by_column = payloads
        self.member_of = member_of
        self.name = job_class.name
        self.queue = rows.queue
        self.jobs = []

    def __len__(self) -> int:
        return len(self.rows)

    def prepare(self, stop: int | None = None) -> None:
        """Build the jobs of the first ``stop`` rows (None: all) not built yet. Handed to
        the engine, which builds them where the database is busy (PostgreSQL's COPY: a
        chunk at a time, while the server reads the lines sent)."""
        count = len(self.rows)
        stop = count if stop is None else min(stop, count)
        start = len(self.jobs)
        if start >= stop:
            return
        args_col, kwargs_col = self.payloads_by_column
        with collector.paused(stop - start):
            self.jobs.extend(unsaved_jobs(self.alias, self.rows, args_col, kwargs_col, start, stop))

    def defer(self, commit_alias: str) -> None:
        self.rows.settle()  # a bad item is refused now, not at the commit
        self.prepare()
        if self.member_of is not None:
            self.member_of.deferred_to(commit_alias)

    def due_now(self) -> set[str]:
        """The queues of the rows that are due at once: the engine's INSERT wakes their
        idle workers."""
        return {self.rows.queue} if self.rows.run_at is None else set()

    def write(self, engine: JobEngine) -> list[Job]:
        """The INSERT: fills in the returned jobs; returns those it created. Members of a
        batch are counted into it in the same transaction."""
        member_of = self.member_of
        if member_of is None:
            return self._write_rows(engine)
        with transaction.atomic(using=self.alias):
            batch_id = member_of.admit(self.alias, len(self.rows))
            self.rows.batch_id = batch_id  # jobs built from here on take it from the rows
            step_of = member_of.step_of
            if step_of is not None:
                # Members of a workflow's batch step: their ends settle the step.
                self.rows.chain_id, self.rows.chain_position = step_of[0].hex, step_of[1]
            for job in self.jobs:  # new objects: no related Batch is cached to invalidate
                job.__dict__["batch_id"] = batch_id
                if step_of is not None:
                    job.chain_id, job.chain_position = step_of
            return self._write_rows(engine)

    def _write_rows(self, engine: JobEngine) -> list[Job]:
        """The INSERT and the returned jobs' ids. The engine builds the jobs (prepare) and
        gives them their ids (fill) where the database is busy (a large COPY: while it
        draws the ids from the sequence, and while it reads the last lines)."""
        rows = self.rows
        unique = self.sender.traits.is_unique
        if unique or not engine.streams_rows(len(rows)):
            rows.settle()
        if unique:
            return self._write_unique(engine)
        if rows.expires_at is None and rows.expires_in is None:
            return self._insert(engine)
        with transaction.atomic(using=self.alias):  # no worker sees a row before its expiry
            created = self._insert(engine)
            self._expire(engine, [job.pk for job in created], created)
        return created

    def _insert(self, engine: JobEngine) -> list[Job]:
        rows = self.rows
        jobs = self.jobs

        def fill(inserted: Inserted) -> None:
            for job, job_id, made_at, next_at in zip(jobs, *inserted, strict=True):
                values = job.__dict__  # as mark_saved(), without a call per job
                values["id"] = job_id
                values["created_at"] = made_at
                values["next_execution_at"] = next_at
                values["_state"].adding = False

        engine.insert_rows(rows, notify=self.due_now(), prepare=self.prepare, meanwhile=fill)
        return jobs

    def _write_unique(self, engine: JobEngine) -> list[Job]:
        """Insert the rows whose key no active job holds; the other returned jobs take the
        values of the job that holds it ("dispatch returns the existing job")."""
        self.prepare()
        rows = self.rows.rows()
        inserted = retrying_deadlocks(
            engine,
            lambda: self._insert_unique(engine, rows),
            f"unique dispatch name={safe(self.name)}",
            self._deadlock_in_callers_transaction,
        )
        window = self.sender.traits.window
        created = []
        existing: dict[int, list[Job]] = {}
        for job, (job_id, created_at, next_at, new) in zip(self.jobs, inserted, strict=True):
            if new:
                mark_saved(job, job_id, created_at, next_at)
                if window is not None:  # as the window's INSERT wrote them
                    job.dedupe_key = job.unique_key
                    if window.kind != "unique_for":
                        job.unique_key = None
                created.append(job)
            else:
                existing.setdefault(job_id, []).append(job)
        if existing:
            for row in Job.objects.using(self.alias).filter(pk__in=list(existing)):
                for job in existing[row.pk]:
                    job.__dict__.update({name: getattr(row, name) for name in FIELDS})
                    job._state.adding = False
        return created

    def _insert_unique(
        self, engine: JobEngine, rows: list[InsertRow]
    ) -> list[tuple[int, datetime, datetime, bool]]:
        """The unique rows' INSERT (under the class's window, if any) and the expiry of
        the rows it wrote, in one transaction. A debounced dispatch that replaced a
        waiting job's arguments gives it its expiry too (the last call wins)."""
        window = self.sender.traits.window
        expiring = self.rows.expires_at is not None or self.rows.expires_in is not None
        if window is None and not expiring:
            return engine.insert_unique(rows, notify=self.due_now())
        with transaction.atomic(using=self.alias):
            if window is None:
                inserted = engine.insert_unique(rows, notify=self.due_now())
            else:
                inserted = engine.insert_windowed(rows, window, notify=self.due_now())
            if expiring:
                replaced = window is not None and window.kind == "debounce"
                ids = [row[0] for row in inserted if row[3] or replaced]
                self._expire(engine, ids, [])
        return inserted

    def _expire(self, engine: JobEngine, ids: list[int], created: list[Job]) -> None:
        """Write the rows' expiry on the jobs ``ids``; ``created`` (returned jobs) take it."""
        rows = self.rows
        engine.set_expiry(ids, rows.expires_at, rows.expires_in)
        if not created:
            return  # jobs found or replaced are read back whole
        if rows.expires_at is not None:
            values: dict[int, datetime | None] = dict.fromkeys(ids, rows.expires_at)
        else:
            found = Job.objects.using(self.alias).filter(pk__in=ids)
            values = dict(found.values_list("pk", "expires_at"))
        for job in created:
            job.__dict__["expires_at"] = values.get(job.pk)

    def _deadlock_in_callers_transaction(self, exc: DatabaseError) -> DispatchDeadlock:
        return DispatchDeadlock(
            f"dispatch of {self.name!r} inside transaction.atomic() lost a deadlock ({exc}); "
            "the database broke it by rolling back the dispatch (InnoDB: the whole "
            "transaction), so run the atomic block again (dispatch retries deadlocks by "
            "itself only outside one)"
        )

    def announce(self, created: list[Job]) -> None:
        if not created:
            return
        signals.send(signals.job_dispatched, self.sender, jobs=created)
        if logger.isEnabledFor(logging.INFO):
            first = created[0]
            if len(created) == 1:
                logger.info(
                    "Enqueued job id=%s name=%s queue=%s", first.pk, safe(first.name), first.queue
                )
            else:
                logger.info(
                    "Enqueued jobs count=%s name=%s queue=%s first_id=%s",
                    len(created),
                    safe(first.name),
                    first.queue,
                    first.pk,
                )
        # Jobs dispatched with wait= or at= are left for run_jobs() and its clock, and so
        # are debounced and throttled ones (their window decides their start).
        window = self.sender.traits.window
        later = window is not None and window.kind != "unique_for"
        if conf.immediate() and self.rows.run_at is None and not later:
            due = [job.pk for job in created]
            immediate.after_commit(self.alias, lambda: immediate.run_immediately(self.alias, due))

    def report_lost(self, tries: int, error_text: str) -> None:
        sealed = self.sender.traits.encrypted
        for row, job in zip(self.rows.rows(), self.jobs, strict=True):
            if sealed:  # the envelopes: whoever holds the key can dispatch them again
                args, kwargs = json.loads(row.args), json.loads(row.kwargs)
            else:
                args, kwargs = redaction.redact_payload(row.name, job.args, job.kwargs)
            logger.error(
                "Deferred dispatch lost: job not inserted name=%s queue=%s priority=%s "
                "run_at=%s args=%s kwargs=%s chain_id=%s tries=%s error=%s",
                safe(row.name),
                safe(row.queue),
                row.priority,
                row.run_at.isoformat() if row.run_at is not None else "now",
                log_json(args),
                log_json(kwargs),
                row.chain_id or "-",
                tries,
                error_text,
            )
