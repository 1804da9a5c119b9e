"""``manage.py gator_prune``: delete finished jobs past their retention."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_gator import conf, wording
from django_gator.engines import get_engine
from django_gator.management.arguments import (
    Choice,
    Seconds,
    WholeNumber,
    add_database_option,
    chosen_database,
)
from django_gator.models import Batch, Job, JobState, WorkflowRun

#: The states gator_prune may delete, in the order it deletes them, with the setting that
#: holds each one's retention. Waiting, running and failed jobs are never deleted.
RETENTION: dict[str, tuple[str, Callable[[], float]]] = {
    JobState.SUCCEEDED.value: ("GATOR_PRUNE_SUCCEEDED_AFTER", conf.prune_succeeded_after),
    JobState.CANCELLED.value: ("GATOR_PRUNE_CANCELLED_AFTER", conf.prune_cancelled_after),
    JobState.DEAD.value: ("GATOR_PRUNE_DEAD_AFTER", conf.prune_dead_after),
}
DEFAULT_STATES = (JobState.SUCCEEDED.value, JobState.CANCELLED.value)
DEFAULT_BATCH_SIZE = 10_000


STATE = Choice(RETENTION, why="waiting, running and failed jobs are never pruned")


def cutoff(now: datetime, retention: float) -> datetime | None:
    """``now - retention``; None when that is before any date (nothing is old enough)."""
    try:
        return now - timedelta(seconds=retention)
    except OverflowError:
        return None


class Command(BaseCommand):
    help = (
        "Delete finished jobs whose finished_at is older than their retention: succeeded "
        "(GATOR_PRUNE_SUCCEEDED_AFTER) and cancelled (GATOR_PRUNE_CANCELLED_AFTER) jobs, and "
        "dead ones (GATOR_PRUNE_DEAD_AFTER) with --dead. Waiting, running and failed jobs are "
        "never deleted. Then the batches and workflows none of whose jobs is left, completed "
        "(created, for a workflow) before the succeeded jobs' cutoff. Rows go in batches by "
        "primary key, one short transaction each, so workers are never held up; times are "
        "the database's."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_option(parser, "prunes")
        parser.add_argument(
            "--state",
            dest="states",
            action="append",
            default=[],
            metavar="STATE",
            help="Prune only this state: succeeded, cancelled or dead; repeat for more. "
            "Default: succeeded and cancelled (and dead with --dead).",
        )
        parser.add_argument(
            "--dead",
            action="store_true",
            help="Also delete dead jobs older than GATOR_PRUNE_DEAD_AFTER.",
        )
        parser.add_argument(
            "--older-than",
            default=None,
            metavar="SECONDS",
            help="Retention in seconds for every pruned state, instead of the settings.",
        )
        parser.add_argument(
            "--batch-size",
            default=DEFAULT_BATCH_SIZE,
            metavar="N",
            help=f"Rows deleted per transaction (default {DEFAULT_BATCH_SIZE:,}).",
        )
        parser.add_argument(
            "--max-batches",
            default=None,
            metavar="N",
            help="Stop after this many batches (default: until nothing is left to prune).",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Print how many jobs would be deleted, and delete nothing.",
        )

    def handle(
        self,
        *,
        states: Sequence[str],
        dead: bool,
        older_than: object,
        batch_size: object,
        max_batches: object,
        dry_run: bool,
        verbosity: int,
        **options: Any,
    ) -> None:
        chosen = self._states(STATE.convert_all(states, "--state"), dead)
        override = None if older_than is None else Seconds().convert(older_than, "--older-than")
        batch = WholeNumber().convert(batch_size, "--batch-size")
        limit = None if max_batches is None else WholeNumber().convert(max_batches, "--max-batches")
        self.verbosity = verbosity

        alias = chosen_database(options)
        now = get_engine(alias).db_now()
        cutoffs: dict[str, datetime | None] = {}
        for state in chosen:
            cutoffs[state] = cutoff(now, override if override is not None else _retention(state))

        # Batches and workflows go once their jobs are gone, past the succeeded ones' cutoff.
        groups_before = cutoff(
            now, override if override is not None else _retention(JobState.SUCCEEDED.value)
        )
        if dry_run:
            self._dry_run(alias, cutoffs, groups_before)
            return
        self._prune(alias, cutoffs, batch, limit, groups_before)

    def _states(self, states: Sequence[str], dead: bool) -> list[str]:
        wanted = set(states)
        if not wanted:
            wanted.update(DEFAULT_STATES)
        if dead:
            wanted.add(JobState.DEAD.value)
        return [state for state in RETENTION if state in wanted]

    def _say(self, text: str) -> None:
        if self.verbosity >= 1:
            self.stdout.write(text)

    def _dry_run(
        self, alias: str, cutoffs: dict[str, datetime | None], groups_before: datetime | None
    ) -> None:
        total = 0
        for state, before in cutoffs.items():
            count = 0 if before is None else _old(alias, state, before).prunable().count()
            total += count
            when = "(retention too long: none)" if before is None else before.isoformat()
            self._say(f"would delete {wording.count(count, state + ' job')} finished before {when}")
        self._say(f"would delete {wording.count(total, 'job')} in all (dry run: nothing deleted)")
        if groups_before is not None:
            batches = Batch.objects.using(alias).finished(before=groups_before).count()
            workflows = WorkflowRun.objects.using(alias).finished(before=groups_before).count()
            self._say(
                f"would delete {wording.count(batches, 'batch')} and "
                f"{wording.count(workflows, 'workflow')} none of whose jobs is left (more "
                "once those jobs are deleted)"
            )

    def _prune(
        self,
        alias: str,
        cutoffs: dict[str, datetime | None],
        batch: int,
        limit: int | None,
        groups_before: datetime | None,
    ) -> None:
        total = 0
        batches = 0
        by_state = dict.fromkeys(cutoffs, 0)
        stopped = False

        def progress(deleted: int) -> None:
            nonlocal total
            total += deleted
            self._say(f"deleted {deleted} (total {total})")

        for state, before in cutoffs.items():
            if before is None:
                continue
            pruned = _old(alias, state, before).prune(
                batch_size=batch,
                max_batches=None if limit is None else limit - batches,
                progress=progress,
            )
            batches += pruned.batches
            by_state[state] += pruned.deleted
            if pruned.stopped:
                stopped = True
                break
        detail = ", ".join(f"{count} {state}" for state, count in by_state.items())
        self._say(f"deleted {wording.count(total, 'job')} ({detail})")
        if not stopped and groups_before is not None:
            groups = {}
            for rows, noun in (
                (Batch.objects.using(alias), "batch"),
                (WorkflowRun.objects.using(alias), "workflow"),
            ):
                pruned = rows.prune(
                    before=groups_before,
                    batch_size=batch,
                    max_batches=None if limit is None else limit - batches,
                )
                batches += pruned.batches
                groups[noun] = pruned.deleted
                if pruned.stopped:
                    stopped = True
                    break
            if any(groups.values()):
                self._say(
                    "deleted "
                    + " and ".join(wording.count(n, noun) for noun, n in groups.items())
                    + " none of whose jobs is left"
                )
        if stopped:
            self._say(
                f"stopped after {wording.count(batches, 'batch')} (--max-batches); more may be left"
            )


def _retention(state: str) -> float:
    """The retention setting of ``state``, checked (CommandError naming a bad value)."""
    setting, retention = RETENTION[state]
    try:
        value = retention()
    except (TypeError, ValueError):
        raise CommandError(
            f"{setting} must be a number of seconds, got {conf.get(setting)!r}"
        ) from None
    if not value >= 0:
        raise CommandError(f"{setting} must be zero or more seconds, got {value!r}")
    return value


def _old(alias: str, state: str, before: datetime) -> Any:
    """Jobs in ``state`` that finished before ``before``."""
    return Job.objects.using(alias).filter(state=state).finished(before=before)
