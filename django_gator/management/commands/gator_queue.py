"""``manage.py gator_queue``: pause and resume queues, and list them."""

from __future__ import annotations

import getpass
import json
import socket
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_gator import pausing, stats
from django_gator.databases import for_queue, job_databases
from django_gator.engines import get_engine
from django_gator.logutil import safe
from django_gator.management.arguments import QUEUE_NAME, require_tables

ACTIONS = ("pause", "resume", "list")


class Command(BaseCommand):
    help = (
        "pause NAME: no worker claims jobs of the queue NAME (on any machine, from its next "
        "claim) until it is resumed; its jobs keep arriving and wait, running ones finish. "
        "resume NAME: workers claim from it again. Pausing a paused queue changes nothing "
        "(who paused it first, and when, stay recorded). list: every known queue (one with "
        "jobs, or one that was ever paused) with its waiting and running jobs and whether it "
        "is paused, by whom and since when; with --json, a JSON list of objects with the keys "
        "queue, ready, scheduled, running, paused, paused_at (ISO 8601 or null), paused_by, "
        'concurrency (null: no limit) and rate_limit ("": none); the limit column shows '
        "running/concurrency and the rate. With several job databases (GATOR_QUEUE_DATABASES) "
        "list shows each database's queues, the alias after the name (and a database key "
        "in the JSON); pause and resume act on the queue's database."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=ACTIONS, help="pause, resume or list.")
        parser.add_argument("name", nargs="?", help="The queue (pause and resume).")
        parser.add_argument(
            "--json",
            dest="as_json",
            action="store_true",
            help="list: print JSON; pause and resume: print {queue, changed, paused}.",
        )

    def handle(self, *, action: str, name: str | None, as_json: bool, **options: Any) -> None:
        if action not in ACTIONS:
            raise CommandError(
                f"unknown action {action!r}: use one of {', '.join(ACTIONS)}", returncode=2
            )
        if action == "list":
            if name is not None:
                raise CommandError(f"list takes no queue name, got {name!r}", returncode=2)
        elif name is None:
            raise CommandError(
                f"{action} needs a queue name: gator_queue {action} NAME", returncode=2
            )
        else:
            name = QUEUE_NAME.convert(name, "NAME")
        # list: every job database's queues; pause and resume: the queue's database.
        aliases = job_databases() if name is None else [for_queue(name)]
        for alias in aliases:
            require_tables(alias)
        if action == "list":
            self._list(aliases, as_json)
            return
        assert name is not None
        by = f"manage.py gator_queue ({getpass.getuser()}@{socket.gethostname()})"
        if action == "pause":
            changed = pausing.pause_queue(name, by=by)
            said = "paused" if changed else "was already paused (left as it was)"
        else:
            changed = pausing.resume_queue(name, by=by)
            said = "resumed" if changed else "was not paused (nothing changed)"
        if as_json:
            document = {"queue": name, "changed": changed, "paused": action == "pause"}
            self.stdout.write(json.dumps(document, sort_keys=True))
        elif options.get("verbosity", 1) >= 1:
            self.stdout.write(f"queue {name} {said}")

    def _list(self, aliases: list[str], as_json: bool) -> None:
        """The queues of ``aliases`` (with several job databases, each labelled with its
        database: a column, and a ``database`` key in the JSON)."""
        labelled = len(aliases) > 1
        queues = [
            (alias, q)
            for alias in aliases
            for q in stats.queue_stats(alias, now=get_engine(alias).db_now())
        ]
        if as_json:
            keys = (
                "queue",
                "ready",
                "scheduled",
                "running",
                "paused",
                "paused_at",
                "paused_by",
                "concurrency",
                "rate_limit",
                "job_limits",
            )
            listed = [
                {key: q.as_dict()[key] for key in keys} | ({"database": a} if labelled else {})
                for a, q in queues
            ]
            self.stdout.write(json.dumps(listed, indent=2, sort_keys=True))
            return
        if not queues:
            self.stdout.write("(no queue has jobs or a row of its own)")
            return
        columns = ["queue", "ready", "scheduled", "running", "state", "since", "by", "limit"]
        rows = [
            [
                safe(q.queue, 100) + (f" ({a})" if labelled else ""),
                str(q.ready),
                str(q.scheduled),
                str(q.running),
                "paused" if q.paused else "active",
                q.paused_at.isoformat(timespec="seconds") if q.paused_at else "-",
                safe(q.paused_by, 150) if q.paused else "-",
                q.limits_text or "-",
            ]
            for a, q in queues
        ]
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
        for cells in [columns, *rows]:
            line = "  ".join(
                cell.rjust(width) if i in (1, 2, 3) else cell.ljust(width)
                for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
            )
            self.stdout.write(line.rstrip())
