"""``manage.py gator_partitions``: the partitioned jobs table of PostgreSQL
(``GATOR_PARTITIONING``): convert to it, list, create and drop its time partitions, go back."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_gator import conf
from django_gator.engines import get_engine
from django_gator.engines.partition_conversion import Conversion
from django_gator.engines.partitions import GRANULARITIES, PartitioningError
from django_gator.management.arguments import Choice, Seconds, WholeNumber

DEFAULT_BATCH_SIZE = 10_000
GRANULARITY = Choice(GRANULARITIES, why="a time partition holds a day or an hour")


class Command(BaseCommand):
    help = (
        "PostgreSQL's partitioned jobs table (GATOR_PARTITIONING): --convert moves a plain "
        "table into it while workers run; --list shows the partitions; --create makes the "
        "time partitions ahead (and those the default partition's rows need); --drop-older-than "
        "drops the time partitions past a retention; --revert goes back to a plain table "
        "(claims wait while it copies); --drop-backup drops the plain table a conversion kept."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_mutually_exclusive_group(required=True)
        actions.add_argument("--convert", action="store_true", help="Convert, online.")
        actions.add_argument("--list", action="store_true", help="List the partitions.")
        actions.add_argument("--create", action="store_true", help="Create partitions ahead.")
        actions.add_argument(
            "--drop-older-than",
            default=None,
            metavar="SECONDS",
            help="Drop the time partitions that end more than SECONDS ago.",
        )
        actions.add_argument("--revert", action="store_true", help="Back to a plain table.")
        actions.add_argument(
            "--drop-backup", action="store_true", help="Drop the plain table kept by --convert."
        )
        parser.add_argument(
            "--granularity",
            default=None,
            metavar="day|hour",
            help="Width of the time partitions (default: GATOR_PARTITIONING).",
        )
        parser.add_argument(
            "--batch-size",
            default=DEFAULT_BATCH_SIZE,
            metavar="N",
            help=f"Rows --convert copies per transaction (default {DEFAULT_BATCH_SIZE:,}).",
        )

    def handle(self, *, verbosity: int, **options: Any) -> None:
        self.verbosity = verbosity
        alias = conf.database()
        conversion = Conversion(alias)
        try:
            self._run(conversion, options)
        except PartitioningError as exc:
            raise CommandError(str(exc)) from exc

    def _granularity(self, given: object) -> str:
        if given is not None:
            return GRANULARITY.convert(given, "--granularity")
        granularity = conf.partitioning()
        if granularity is None:
            raise CommandError(
                "GATOR_PARTITIONING is not set: set it to 'day' or 'hour' (or pass --granularity)"
            )
        return granularity

    def _run(self, conversion: Conversion, options: dict[str, Any]) -> None:
        if options["convert"]:
            granularity = self._granularity(options["granularity"])
            batch = WholeNumber().convert(options["batch_size"], "--batch-size")
            copied = conversion.convert(granularity, batch_size=batch, progress=self._say)
            self._say(
                f"converted: the jobs table is partitioned by {granularity} ({copied} rows "
                f"copied by batches); the plain table is kept as "
                f"{conversion.names['backup']!r} until --drop-backup"
            )
        elif options["list"]:
            conversion.require_partitioned()
            for name, bounds, rows in conversion.sizes():
                self.stdout.write(f"{name}\t{bounds}\t~{rows} rows")
            conversion.check_default()
        elif options["create"]:
            now = get_engine(conversion.alias).db_now()
            created = conversion.ensure(now, self._granularity(options["granularity"]))
            self._say(f"created {len(created)} partitions: {', '.join(created) or '-'}")
            if conversion.check_default():
                raise CommandError(
                    "rows are left in the default partition (their finished_at has none yet): "
                    "run --create again"
                )
        elif options["drop_older_than"] is not None:
            seconds = Seconds().convert(options["drop_older_than"], "--drop-older-than")
            cutoff = get_engine(conversion.alias).db_now() - timedelta(seconds=seconds)
            dropped = conversion.drop_before(cutoff)
            self._say(f"dropped {len(dropped)} partitions: {', '.join(dropped) or '-'}")
        elif options["revert"]:
            copied = conversion.revert()
            self._say(f"reverted: the jobs table is a plain table ({copied} rows copied)")
        elif conversion.drop_backup():
            self._say(f"dropped {conversion.names['backup']!r}")
        else:
            self._say(f"there is no {conversion.names['backup']!r} to drop")

    def _say(self, text: str) -> None:
        if self.verbosity >= 1:
            self.stdout.write(text)
