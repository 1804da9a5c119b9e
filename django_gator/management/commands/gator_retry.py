"""``manage.py gator_retry``: put dead (and failed) jobs back to ``waiting``."""

from __future__ import annotations

import getpass
import re
import socket
from collections.abc import Iterable, Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q, QuerySet

from django_gator import conf, wording
from django_gator.management.commands.gator_prune import whole_number
from django_gator.models import Job, JobState
from django_gator.validation import short_repr, validate_name, validate_queue

#: Jobs retried per transaction (well under SQLite's 999 parameters per statement).
BATCH = 500
#: An exception class as the worker records it: ``ValueError``, ``myapp.jobs.Boom``.
ERROR_CLASS_RE = re.compile(r"[^\s:]+")
SELECTORS = "--name, --error, --id or --all"


def error_class(last_error: str, errors: Any = None) -> str:
    """The exception class of a job's last attempt: the ``class`` of the last entry of its
    error history, else what precedes the first ``:`` of ``last_error``."""
    if isinstance(errors, list) and errors and isinstance(errors[-1], dict):
        recorded = errors[-1].get("class")
        if isinstance(recorded, str) and recorded:
            return recorded
    return last_error.split(":", 1)[0].strip()


def class_matches(recorded: str, wanted: str) -> bool:
    """``wanted`` is the recorded class, or its last dotted parts (``Boom`` and
    ``jobs.Boom`` both match ``myapp.jobs.Boom``)."""
    return bool(recorded) and (recorded == wanted or recorded.endswith("." + wanted))


class Command(BaseCommand):
    help = (
        "Retry dead jobs (and failed ones with --failed): make them due now, keeping their "
        "attempts and error history. Choose the jobs with --name, --error, --id (each "
        "repeatable; different options must all match) or --all. A unique job whose key is "
        "held by another waiting, failed or running job is skipped."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--name",
            dest="names",
            action="append",
            default=[],
            metavar="NAME",
            help="Jobs with this registered job name; repeat for more.",
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
        for name in names:
            try:
                validate_name(name)
            except ValueError as exc:
                raise CommandError(f"--name: {exc}", returncode=2) from None
        for wanted in errors:
            if not isinstance(wanted, str) or not ERROR_CLASS_RE.fullmatch(wanted):
                raise CommandError(
                    f"--error {short_repr(wanted)} is not an exception class name "
                    "(such as ValueError or myapp.jobs.PaymentDeclined)",
                    returncode=2,
                )
        job_ids = [whole_number(value, "--id") for value in ids]
        if queue is not None:
            try:
                validate_queue(queue)
            except ValueError as exc:
                raise CommandError(f"--queue: {exc}", returncode=2) from None
        if every and (names or errors or job_ids):
            raise CommandError(
                "--all retries every dead job; do not combine it with --name, --error or --id",
                returncode=2,
            )
        if not (every or names or errors or job_ids):
            raise CommandError(
                f"choose the jobs to retry with {SELECTORS} (nothing was retried)", returncode=2
            )

        alias = conf.database()
        states = [JobState.DEAD.value] + ([JobState.FAILED.value] if failed else [])
        selected = Job.objects.using(alias).filter(state__in=states).order_by("id")
        if names:
            selected = selected.filter(name__in=sorted(set(names)))
        if job_ids:
            selected = selected.filter(pk__in=sorted(set(job_ids)))
        chosen = _matching(selected, errors) if errors else _ids(selected)
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
                self.stdout.write(
                    f"would retry {wording.count(len(chosen), what + ' job')}{onto} "
                    "(dry run: nothing changed; unique jobs whose key is held by an active job "
                    "would be skipped)"
                )
                if verbosity >= 2 and chosen:
                    self.stdout.write(f"ids: {', '.join(map(str, chosen))}")
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


def _ids(selected: QuerySet[Job]) -> list[int]:
    return list(selected.values_list("id", flat=True).iterator())


def _matching(selected: QuerySet[Job], wanted: Sequence[str]) -> list[int]:
    """Ids of the selected jobs whose last attempt raised one of the ``wanted`` classes.

    ``last_error`` starts with the class (``myapp.Boom: message``) and is short, so it is
    what is read; the error history (tracebacks, possibly large) only for the rare rows
    without a ``last_error``.
    """
    rough = Q()
    for cls in wanted:
        # A superset of the matches; the exact test is in Python (SQLite's LIKE ignores case).
        rough |= Q(last_error__startswith=cls) | Q(last_error__contains=f".{cls}")
    found: set[int] = set()
    for pk, last_error in selected.filter(rough).values_list("id", "last_error").iterator():
        if _any_match(error_class(last_error), wanted):
            found.add(pk)
    no_summary = selected.filter(last_error="", errors__isnull=False)
    for pk, history in no_summary.values_list("id", "errors").iterator():
        if _any_match(error_class("", history), wanted):
            found.add(pk)
    return sorted(found)


def _any_match(recorded: str, wanted: Iterable[str]) -> bool:
    return any(class_matches(recorded, cls) for cls in wanted)


def _retry(alias: str, ids: list[int], states: list[str], queue: str | None) -> int:
    """Retry one batch; returns how many jobs went back to ``waiting``.

    JobQuerySet.retry() moves exactly the jobs it retried onto ``queue`` (a unique job
    skipped for its key stays where it was) and records the command and the user running
    it in each job's audit trail.
    """
    by = f"manage.py gator_retry ({getpass.getuser()}@{socket.gethostname()})"
    jobs = Job.objects.using(alias).filter(pk__in=ids, state__in=states)
    return jobs.retry(by=by, queue=queue)
