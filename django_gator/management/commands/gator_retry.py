"""``manage.py gator_retry``: put dead (and failed) jobs back to ``waiting``."""

from __future__ import annotations

import getpass
import socket
from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_gator import wording
from django_gator.exceptions import JobNotRegistered
from django_gator.management.arguments import (
    EXCEPTION_CLASS,
    JOB_NAME,
    QUEUE_NAME,
    WholeNumber,
    add_database_option,
    chosen_database,
)
from django_gator.models import Job, JobState
from django_gator.registry import get_job_class

#: Jobs retried per call of JobQuerySet.retry() (well under SQLite's 999 parameters per
#: statement).
BATCH = 500
SELECTORS = "--name, --error, --id or --all"


class Command(BaseCommand):
    help = (
        "Retry dead jobs (and failed ones with --failed): make them due now, keeping their "
        "attempts and error history. Choose the jobs with --name, --error, --id (each "
        "repeatable; different options must all match) or --all. A unique job whose key is "
        "held by another waiting, failed or running job is skipped."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_option(parser, "retries")
        parser.add_argument(
            "--name",
            dest="names",
            action="append",
            default=[],
            metavar="NAME",
            help="Jobs with this job name (registered, or held by a job in the database; "
            "any other is refused, with the close names suggested); repeat for more.",
        )
        parser.add_argument(
            "--error",
            dest="errors",
            action="append",
            default=[],
            metavar="CLASS",
            help="Jobs whose last attempt raised this exception class (as recorded, e.g. "
            "myapp.jobs.PaymentDeclined, or its last parts, e.g. PaymentDeclined); repeat "
            "for more.",
        )
        parser.add_argument(
            "--id",
            dest="ids",
            action="append",
            default=[],
            metavar="N",
            help="The job with this id; repeat for more.",
        )
        parser.add_argument(
            "--all", dest="every", action="store_true", help="Every dead job (and failed one)."
        )
        parser.add_argument(
            "--failed",
            action="store_true",
            help="Also retry failed jobs (waiting for their next attempt) now.",
        )
        parser.add_argument(
            "--queue",
            default=None,
            metavar="NAME",
            help="Move the retried jobs onto this queue.",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Print how many jobs would be retried, and change nothing.",
        )

    def handle(
        self,
        *,
        names: Sequence[str],
        errors: Sequence[str],
        ids: Sequence[object],
        every: bool,
        failed: bool,
        queue: str | None,
        dry_run: bool,
        verbosity: int,
        **options: Any,
    ) -> None:
        names = JOB_NAME.convert_all(names, "--name")
        errors = EXCEPTION_CLASS.convert_all(errors, "--error")
        job_ids = WholeNumber().convert_all(ids, "--id")
        if queue is not None:
            queue = QUEUE_NAME.convert(queue, "--queue")
        _check_selection(every, names, errors, job_ids)

        alias = chosen_database(options)
        _check_names(alias, names)
        states = [JobState.DEAD.value] + ([JobState.FAILED.value] if failed else [])
        chosen = _chosen(alias, states, names, errors, job_ids)
        what = " or ".join(states)

        if job_ids and verbosity >= 1:
            missing = sorted(set(job_ids) - set(chosen))
            if missing:
                self.stdout.write(
                    f"not {what} (or not matching the other options): "
                    f"{', '.join(map(str, missing))}"
                )
        onto = f" onto queue {queue!r}" if queue else ""
        if dry_run:
            if verbosity >= 1:
                self._dry_run(chosen, what, onto, verbosity)
            return

        retried = 0
        for start in range(0, len(chosen), BATCH):
            retried += _retry(alias, chosen[start : start + BATCH], states, queue)
        skipped = len(chosen) - retried
        if verbosity >= 1:
            why = " (a unique job whose key is held by an active job, or changed meanwhile)"
            self.stdout.write(
                f"retried {wording.count(retried, 'job')}{onto}, "
                f"skipped {skipped}{why if skipped else ''}"
            )

    def _dry_run(self, chosen: list[int], what: str, onto: str, verbosity: int) -> None:
        """Say what would be retried."""
        self.stdout.write(
            f"would retry {wording.count(len(chosen), what + ' job')}{onto} "
            "(dry run: nothing changed; unique jobs whose key is held by an active job "
            "would be skipped)"
        )
        if verbosity >= 2 and chosen:
            self.stdout.write(f"ids: {', '.join(map(str, chosen))}")


def _check_selection(
    every: bool, names: Sequence[str], errors: Sequence[str], job_ids: Sequence[int]
) -> None:
    """Refuse --all with another selector, and no selector at all."""
    if every and (names or errors or job_ids):
        raise CommandError(
            "--all retries every dead job; do not combine it with --name, --error or --id",
            returncode=2,
        )
    if not (every or names or errors or job_ids):
        raise CommandError(
            f"choose the jobs to retry with {SELECTORS} (nothing was retried)", returncode=2
        )


def _check_names(alias: str, names: Sequence[str]) -> None:
    """Refuse a ``--name`` that no job has: neither registered nor on any row of the
    database (a dead job may outlive its class), suggesting close names as
    :func:`~django_gator.registry.get_job_class` does."""
    for name in dict.fromkeys(names):
        try:
            get_job_class(name)
        except JobNotRegistered as exc:
            if Job.objects.using(alias).filter(name=name).exists():
                continue
            hint = ""
            if exc.suggestions:
                hint = "; did you mean " + " or ".join(map(repr, exc.suggestions)) + "?"
            raise CommandError(
                f"--name {name!r}: no job has this name (it is not registered, and no job "
                f"in database {alias!r} has it){hint} (nothing was retried)",
                returncode=2,
            ) from None


def _chosen(
    alias: str,
    states: list[str],
    names: Sequence[str],
    errors: Sequence[str],
    job_ids: Sequence[int],
) -> list[int]:
    """The ids of the jobs in ``states`` that match every selector given, in id order."""
    selected = Job.objects.using(alias).filter(state__in=states).order_by("id")
    if names:
        selected = selected.filter(name__in=sorted(set(names)))
    if job_ids:
        selected = selected.filter(pk__in=sorted(set(job_ids)))
    if errors:
        selected = selected.raised(*errors)
    return list(selected.values_list("id", flat=True).iterator())


def _retry(alias: str, ids: list[int], states: list[str], queue: str | None) -> int:
    """Retry one batch; returns how many jobs went back to ``waiting``.

    JobQuerySet.retry() moves exactly the jobs it retried onto ``queue`` (a unique job
    skipped for its key stays where it was) and records the command and the user running
    it in each job's audit trail.
    """
    by = f"manage.py gator_retry ({getpass.getuser()}@{socket.gethostname()})"
    jobs = Job.objects.using(alias).filter(pk__in=ids, state__in=states)
    return jobs.retry(by=by, queue=queue)
