"""``manage.py gator_status``: queues, live workers and the size of the jobs table."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_gator import health, replicas, stats, wording
from django_gator.databases import job_databases
from django_gator.engines import get_engine
from django_gator.logutil import safe
from django_gator.management.arguments import Seconds, WholeNumber, require_tables
from django_gator.models import Job, JobState
from django_gator.progress_figures import progress_parts, progress_text
from django_gator.replicas import ReadSource

QUEUE_COLUMNS = (
    "queue",
    "ready",
    "scheduled",
    "running",
    "failed(retrying)",
    "dead",
    "oldest due age",
    "done/h",
    "dead/h",
    "paused",
    "limit",
)
WORKER_COLUMNS = ("worker", "queues", "threads", "running", "heartbeat age", "running job ids")
SUMMED = (
    "ready",
    "scheduled",
    "running",
    "failed",
    "dead",
    "succeeded_last_hour",
    "dead_last_hour",
)
#: Running job ids shown per worker in the text output (--json lists them all).
MAX_IDS_SHOWN = 10


class Command(BaseCommand):
    help = (
        "Show each queue's jobs by state, the live workers and the size of the jobs table, "
        "all by database time. "
        "Queue columns: ready (waiting or failed, due now), scheduled (waiting or failed, due "
        "later), running, failed(retrying) (failed jobs that will run again; also counted in "
        "ready or scheduled), dead, oldest due age (how long the oldest ready job has waited), "
        "done/h and dead/h (jobs that succeeded or died in the last hour, by finished_at), "
        "paused (yes when no worker claims from the queue: see gator_queue), limit (running/"
        "concurrency and the rate limit, when the queue has limits). "
        "With --json, one JSON document with the keys: now (ISO 8601 database time), database "
        "(alias), vendor, queues (a list of objects with queue, ready, scheduled, running, "
        "failed, dead, oldest_due_at, oldest_due_age (seconds or null), oldest_running_at, "
        "oldest_running_age (seconds the oldest running job has run, or null), "
        "succeeded_last_hour, "
        "dead_last_hour, succeeded and cancelled (null unless --exact), paused (true or "
        "false), paused_at (ISO 8601 or null), paused_by, concurrency (null: no limit), "
        'rate_limit ("": none), limits_by, and job_limits: the limits job classes of the '
        "queue declare, each with job, concurrency_limit, rate_limit and per_key), "
        "workers (a list of "
        "objects with id, hostname, pid, queues, concurrency, started_at, heartbeat_at, "
        "heartbeat_age (seconds), stale (true when the heartbeat is older than half of "
        "GATOR_HEARTBEAT_TIMEOUT), running, running_job_ids, supervisor: the id of the "
        "gator_worker --processes supervisor that started it, or empty), total_rows (an "
        "object with count and exact: false when count is the database's estimate) and "
        "progress (the first 20 running jobs that report progress, by id: objects with id, "
        "name and progress: done, total, note, rate, at). With several job databases "
        "(GATOR_QUEUE_DATABASES) each is shown under its alias, and the JSON document (that "
        "of GATOR_DATABASE) has a databases key: the same document for each job database."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--json",
            dest="as_json",
            action="store_true",
            help="Print one JSON document instead of tables (keys listed above).",
        )
        parser.add_argument(
            "--exact",
            action="store_true",
            help="Also count every succeeded and cancelled job per queue (reads all of "
            "them: slow on large tables).",
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="Health check: exit 0 when healthy, 1 with the reasons otherwise (the "
            "database unreachable, fewer live workers than --min-workers, a live worker whose "
            "heartbeat is stale: older than half of GATOR_HEARTBEAT_TIMEOUT, a queue's oldest "
            "due job older than --max-latency, a job running longer than --max-running).",
        )
        parser.add_argument(
            "--max-latency",
            type=Seconds(),
            default=None,
            metavar="SECONDS",
            help="With --check: unhealthy when a queue that is not paused has a due job "
            "waiting longer than this.",
        )
        parser.add_argument(
            "--max-running",
            type=Seconds(),
            default=None,
            metavar="SECONDS",
            help="With --check: unhealthy when a job has been running (since its claim) "
            "longer than this; each one is named with its id, name, worker and age.",
        )
        parser.add_argument(
            "--min-workers",
            type=WholeNumber(0),
            default=1,
            metavar="N",
            help="With --check: unhealthy with fewer live workers than this (default 1).",
        )

    def handle(
        self,
        *,
        as_json: bool,
        exact: bool,
        check: bool,
        max_latency: float | None,
        min_workers: int,
        max_running: float | None,
        **options: Any,
    ) -> None:
        if check:
            self._check(max_latency, min_workers, max_running)
            return
        if max_latency is not None or min_workers != 1 or max_running is not None:
            raise CommandError(
                "--max-latency, --max-running and --min-workers go with --check", returncode=2
            )
        aliases = job_databases()
        sources = [replicas.read_source()] + [ReadSource(a, a) for a in aliases[1:]]
        for source in sources:
            require_tables(source.alias)
        if as_json:
            documents = [self._document(source, exact) for source in sources]
            if len(documents) > 1:  # every job database, GATOR_DATABASE's at the top too
                documents[0]["databases"] = [dict(d) for d in documents]
            self.stdout.write(json.dumps(documents[0], indent=2, sort_keys=True))
            return
        for number, source in enumerate(sources):
            if len(sources) > 1:
                self.stdout.write(("\n" if number else "") + f"Database {aliases[number]!r}")
            self._print_text(source, exact)

    def _print_text(self, source: replicas.ReadSource, exact: bool) -> None:
        """The tables of one job database, read from ``source``."""
        alias = source.alias
        now = get_engine(alias).db_now()
        queues = stats.queue_stats(alias, exact=exact, now=now)
        live = stats.workers(alias, now=now)
        total, total_exact = stats.estimated_total(alias)
        progress = running_progress(alias)
        if source.replica is not None:
            self.stdout.write(source.describe())
            self.stdout.write("")
        self._print_queues(queues, exact)
        self.stdout.write("")
        self._print_workers(live)
        self.stdout.write("")
        if progress:
            self._print_progress(progress)
            self.stdout.write("")
        how = "exactly" if total_exact else "about (database estimate)"
        self.stdout.write(
            f"Jobs table: {how} {wording.count(total, 'row')}. Database time {now.isoformat()}."
        )

    def _check(
        self, max_latency: float | None, min_workers: int, max_running: float | None
    ) -> None:
        """Each job database checked (``--min-workers`` live workers each); a problem of
        another database than GATOR_DATABASE names it."""
        aliases = job_databases()
        problems, live = [], 0
        for number, alias in enumerate(aliases):
            source = replicas.read_source() if number == 0 else ReadSource(alias, alias)
            result = health.check(
                source.alias,
                max_latency=max_latency,
                min_workers=min_workers,
                max_running=max_running,
                lag=source.lag or 0.0,
            )
            problems += [f"database {alias!r}: {p}" if number else p for p in result.problems]
            live += result.live_workers
        if problems:
            raise CommandError("unhealthy: " + "; ".join(problems), returncode=1)
        self.stdout.write(f"healthy: {wording.count(live, 'live worker')}")

    def _document(self, source: replicas.ReadSource, exact: bool) -> dict[str, Any]:
        """The JSON document of one job database, read from ``source``."""
        alias = source.alias
        now = get_engine(alias).db_now()
        total, total_exact = stats.estimated_total(alias)
        document: dict[str, Any] = {
            "now": now.isoformat(),
            "database": alias,
            "vendor": connections[alias].vendor,
            "queues": [q.as_dict() for q in stats.queue_stats(alias, exact=exact, now=now)],
            "workers": [w.as_dict() for w in stats.workers(alias, now=now)],
            "total_rows": {"count": total, "exact": total_exact},
            "progress": running_progress(alias),
        }
        if source.replica is not None:
            document["replica"] = {
                "alias": source.replica,
                "read": source.on_replica,
                "lag_seconds": source.lag,
                "fallback": source.fallback or None,
            }
        return document

    def _print_progress(self, progress: list[dict[str, Any]]) -> None:
        self.stdout.write(f"Progress of running jobs (first {MAX_PROGRESS_SHOWN})")
        rows = []
        for item in progress:
            parts = progress_parts(item["progress"])
            if parts is None:
                continue
            eta = "" if parts["eta"] is None else wording.age(parts["eta"])
            rate = "" if parts["rate"] is None else f"{parts['rate']:g}/s"
            rows.append(
                [str(item["id"]), item["name"], progress_text(parts), rate, eta, parts["note"]]
            )
        self._table(["job", "name", "done", "rate", "eta", "note"], rows)

    def _print_queues(self, queues: list[stats.QueueStats], exact: bool) -> None:
        columns = list(QUEUE_COLUMNS)
        if exact:
            columns += ["succeeded", "cancelled"]
        rows = [_queue_row(q, exact) for q in queues]
        if len(queues) > 1:
            rows.append(_queue_row(_totals(queues, exact), exact))
        self.stdout.write("Queues")
        if not rows:
            self.stdout.write("  (no waiting, running, failed or dead jobs)")
            return
        self._table(columns, rows)

    def _print_workers(self, live: list[stats.WorkerStats]) -> None:
        self.stdout.write(f"Workers ({len(live)} live)")
        if not live:
            self.stdout.write("  (none: no heartbeat within GATOR_HEARTBEAT_TIMEOUT)")
            return
        rows = []
        for supervisor, w in _under_supervisors(live):
            if w is None:  # the line of a supervisor, above its worker processes
                rows.append([f"supervisor {safe(supervisor)}", "", "", "", "", ""])
                continue
            ids = ", ".join(str(i) for i in w.running_job_ids[:MAX_IDS_SHOWN])
            if w.running > MAX_IDS_SHOWN:
                ids += f", ... (+{w.running - MAX_IDS_SHOWN})"
            rows.append(
                [
                    f"  {w.id}" if supervisor else w.id,
                    _queues_text(w.queues),
                    str(w.concurrency),
                    str(w.running),
                    wording.age(w.heartbeat_age) + (" stale" if w.stale else ""),
                    ids or "-",
                ]
            )
        self._table(WORKER_COLUMNS, rows, left=(0, 1, 5))

    def _table(
        self, columns: Sequence[str], rows: list[list[str]], left: Sequence[int] = (0,)
    ) -> None:
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]

        def line(cells: Sequence[str]) -> str:
            parts = [
                cell.ljust(width) if i in left else cell.rjust(width)
                for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
            ]
            return "  " + "  ".join(parts).rstrip()

        self.stdout.write(line(columns))
        for row in rows:
            self.stdout.write(line(row))


#: Running jobs whose progress gator_status shows.
MAX_PROGRESS_SHOWN = 20


def running_progress(alias: str) -> list[dict[str, Any]]:
    """The id, name and progress of the first running jobs that report progress."""
    rows = (
        Job.objects.using(alias)
        .filter(state=JobState.RUNNING, progress__isnull=False)
        .order_by("id")
        .values("id", "name", "progress")[:MAX_PROGRESS_SHOWN]
    )
    return [dict(row) for row in rows]


def _under_supervisors(
    live: list[stats.WorkerStats],
) -> list[tuple[str, stats.WorkerStats | None]]:
    """The workers in the order to print them: those started on their own first, then
    each supervisor's (``(supervisor, None)``, then ``(supervisor, worker)`` for each of
    its processes). Within a group, as given (oldest first)."""
    alone: list[tuple[str, stats.WorkerStats | None]] = [("", w) for w in live if not w.supervisor]
    groups: dict[str, list[stats.WorkerStats]] = {}
    for w in live:
        if w.supervisor:
            groups.setdefault(w.supervisor, []).append(w)
    for supervisor, members in groups.items():
        alone.append((supervisor, None))
        alone.extend((supervisor, w) for w in members)
    return alone


def _totals(queues: list[stats.QueueStats], exact: bool) -> stats.QueueStats:
    """The "(all)" row: sums, and the oldest due age of any queue."""
    total = stats.QueueStats(queue="(all)")
    for key in SUMMED:
        setattr(total, key, sum(getattr(q, key) for q in queues))
    ages = [q.oldest_due_age for q in queues if q.oldest_due_age is not None]
    total.oldest_due_age = max(ages) if ages else None
    if exact:
        total.succeeded = sum(q.succeeded or 0 for q in queues)
        total.cancelled = sum(q.cancelled or 0 for q in queues)
    return total


def _queue_row(q: stats.QueueStats, exact: bool) -> list[str]:
    row = [
        safe(q.queue, 100),
        str(q.ready),
        str(q.scheduled),
        str(q.running),
        str(q.failed),
        str(q.dead),
        "-" if q.oldest_due_age is None else wording.age(q.oldest_due_age),
        str(q.succeeded_last_hour),
        str(q.dead_last_hour),
        "yes" if q.paused else "",
        q.limits_text,
    ]
    if exact:
        row += [str(q.succeeded), str(q.cancelled)]
    return row


def _queues_text(queues: list[Any]) -> str:
    if not queues:
        return "(all)"
    parts = []
    for item in queues:
        if isinstance(item, list | tuple) and len(item) == 2:
            name, weight = item
            parts.append(safe(str(name)) if weight == 1 else f"{safe(str(name))},{weight}")
        else:
            parts.append(safe(str(item)))
    return " ".join(parts)
