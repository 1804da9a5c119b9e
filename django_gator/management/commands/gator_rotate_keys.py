"""``manage.py gator_rotate_keys``: seal every encrypted job row again with the newest key
of ``GATOR_ENCRYPTION_KEYS`` (see :mod:`django_gator.models.sealing`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_gator import conf
from django_gator.exceptions import EncryptionUnavailable
from django_gator.logutil import safe
from django_gator.management.arguments import WholeNumber, require_tables
from django_gator.models.sealing import encrypted_names, rotate

DEFAULT_BATCH_SIZE = 500
#: Undecryptable rows listed one by one in the output (the rest are counted).
LISTED = 20


class Command(BaseCommand):
    help = (
        "Re-encrypt the stored data of encrypted jobs (arguments, results, checkpoints, error "
        "texts) with the newest key of GATOR_ENCRYPTION_KEYS, and encrypt the rows of "
        "encrypted job classes still in clear. Rows go by primary key in batches; each "
        "row's rewrite is a compare-and-set on what was read, so it runs while workers "
        "run and never overwrites what they write. Exits 1 when a row could not be "
        "decrypted (its key is not in GATOR_ENCRYPTION_KEYS, or it was tampered with)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--batch-size",
            default=DEFAULT_BATCH_SIZE,
            metavar="N",
            help=f"Rows read per batch (default {DEFAULT_BATCH_SIZE}).",
        )
        parser.add_argument(
            "--job",
            dest="names",
            action="append",
            default=[],
            metavar="NAME",
            help="Rotate the rows of this job name (repeat for more), e.g. a class that is no "
            "longer encrypted but has encrypted rows. Default: every class with "
            "encrypted = True.",
        )

    def handle(
        self, *, batch_size: object, names: Sequence[str], verbosity: int, **options: Any
    ) -> None:
        size = WholeNumber().convert(batch_size, "--batch-size")
        wanted = list(names) or encrypted_names()
        if not wanted:
            if verbosity >= 1:
                self.stdout.write("No job class has encrypted = True; nothing to rotate.")
            return
        require_tables(conf.database())
        try:
            report = rotate(conf.database(), batch_size=size, names=wanted)
        except EncryptionUnavailable as exc:
            raise CommandError(str(exc)) from None
        if verbosity >= 1:
            self.stdout.write(
                f"Rows examined: {report.examined}; re-encrypted with key id "
                f"{report.key_id}: {report.resealed}; read again after a worker changed "
                f"them: {report.reread}."
            )
        if report.clashes:
            self.stderr.write(
                "Unique keys left under the old key, as a job dispatched after the new key "
                f"came first holds the same key: jobs {', '.join(map(str, report.clashes))}"
            )
        if report.contended:
            self.stderr.write(
                f"Rows changed on every read, left as they were (run again): "
                f"{', '.join(str(pk) for pk in report.contended)}"
            )
        if report.undecryptable:
            for pk, error in report.undecryptable[:LISTED]:
                self.stderr.write(f"job {pk}: {safe(error)}")
            raise CommandError(
                f"{len(report.undecryptable)} row(s) could not be decrypted and were left as "
                "they are; add their keys back to GATOR_ENCRYPTION_KEYS (after the newest) and "
                "run gator_rotate_keys again"
            )
