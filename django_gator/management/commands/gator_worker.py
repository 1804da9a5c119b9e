"""``manage.py gator_worker``: run jobs."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_gator import conf, health, metrics
from django_gator.conf.checking import problems as settings_problems
from django_gator.databases import job_databases
from django_gator.exceptions import ReadOnlyDatabase, SchemaMissing
from django_gator.logutil import safe
from django_gator.management.arguments import QUEUE_SPEC, SettingValue, WholeNumber
from django_gator.worker.beacon import Beacon
from django_gator.worker.children import EXIT_RECYCLED
from django_gator.worker.limits import Limits
from django_gator.worker.processes import ProcessSupervisor, as_child, child_arguments
from django_gator.worker.queues import QueueSpec
from django_gator.worker.supervisor import WorkerProcess

#: Options of the supervisor alone, not passed on to the worker processes it starts.
#: The health file is the supervisor's: it stands for every worker process (see processes.py).
SUPERVISOR_ONLY = (
    *("processes", "supervisor", "beacon", "health_file"),
    *("settings", "pythonpath", "skip_checks", "version"),
)


class Command(BaseCommand):
    help = "Run background jobs: claim due jobs from the database and run them in threads."

    def add_arguments(self, parser: CommandParser) -> None:
        self._add_work_arguments(parser)
        self._add_timing_arguments(parser)
        self._add_observation_arguments(parser)
        self._add_process_arguments(parser)

    def _add_work_arguments(self, parser: CommandParser) -> None:
        """What the worker runs, and how many at once."""
        parser.add_argument(
            "-q",
            "--queue",
            dest="queues",
            action="append",
            type=QUEUE_SPEC,
            default=[],
            metavar="NAME[,WEIGHT]",
            help=(
                "A queue to work on, with an optional weight (default 1); repeat for more "
                "queues. With different weights a queue is picked in proportion to its weight "
                "while several have work. Default: every queue, equally."
            ),
        )
        parser.add_argument(
            "--isolate-queue",
            dest="isolate_queues",
            action="append",
            default=[],
            metavar="NAME",
            help=(
                "Run every job of this queue (one of the -q queues) in a child process of its "
                'own, as isolation = "process" does for a job class; repeat for more queues.'
            ),
        )
        parser.add_argument(
            "-c",
            "--concurrency",
            type=SettingValue("GATOR_CONCURRENCY", int),
            default=None,
            help="Executor threads (default GATOR_CONCURRENCY, "
            f"{conf.DEFAULTS['GATOR_CONCURRENCY']}).",
        )
        parser.add_argument(
            "--async-concurrency",
            type=SettingValue("GATOR_ASYNC_CONCURRENCY", int),
            default=None,
            help="`async def` jobs run at once on the worker's event loop (default "
            f"GATOR_ASYNC_CONCURRENCY, {conf.DEFAULTS['GATOR_ASYNC_CONCURRENCY']}).",
        )
        parser.add_argument(
            "--database",
            dest="databases",
            action="append",
            default=[],
            metavar="ALIAS",
            help="A job database to serve (GATOR_DATABASE, or an alias GATOR_QUEUE_DATABASES "
            "routes queues to); repeat for more. Default: every job database. Each is served by "
            "worker processes of its own (--processes for each), under one supervisor.",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Run what is due now, then exit (for cron, CI and tests). Due jobs held "
            "back only by a concurrency or rate limit are waited for and run.",
        )

    def _add_timing_arguments(self, parser: CommandParser) -> None:
        """How long it waits: to stop, between looks for due jobs; and the schedules."""
        parser.add_argument(
            "--shutdown-timeout",
            type=SettingValue("GATOR_SHUTDOWN_TIMEOUT", float),
            default=None,
            help="Seconds running jobs get to finish after SIGINT/SIGTERM (default "
            "GATOR_SHUTDOWN_TIMEOUT).",
        )
        parser.add_argument(
            "--poll-interval",
            type=SettingValue("GATOR_POLL_INTERVAL", float),
            default=None,
            help="Longest pause, in seconds, between looks for due jobs while idle (default "
            f"GATOR_POLL_INTERVAL; {conf.allowed_range('GATOR_POLL_INTERVAL')}).",
        )
        parser.add_argument(
            "--no-scheduler",
            action="store_true",
            help="Do not dispatch cron schedules from this worker (default: GATOR_SCHEDULER).",
        )

    def _add_observation_arguments(self, parser: CommandParser) -> None:
        """How it is watched: the metrics endpoint and the health file."""
        parser.add_argument(
            "--metrics-port",
            type=SettingValue("GATOR_METRICS_PORT", int),
            default=None,
            help="Serve Prometheus metrics at http://HOST:PORT/metrics (default "
            "GATOR_METRICS_PORT: none). Needs django-gator[prometheus].",
        )
        parser.add_argument(
            "--health-file",
            default=None,
            metavar="PATH",
            help="Touch this file at start-up and at every heartbeat (for a liveness probe "
            "that checks its age). With --processes, the supervisor keeps it: its age is that "
            "of the stalest worker process's last heartbeat.",
        )

    def _add_process_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "-p",
            "--processes",
            type=SettingValue("GATOR_PROCESSES", int),
            default=None,
            help="Worker processes (each with --concurrency threads) kept by a supervisor "
            "that restarts any that dies or recycles, --processes 1 included (without it: "
            "GATOR_PROCESSES, 1, run in this process, which exits when it recycles).",
        )
        parser.add_argument(
            "--max-jobs",
            type=WholeNumber(1),
            default=None,
            metavar="N",
            help="Recycle a worker process after it has claimed N jobs: it stops claiming, "
            "finishes them and exits (with --processes, a fresh one replaces it).",
        )
        parser.add_argument(
            "--max-memory",
            type=WholeNumber(1),
            default=None,
            metavar="MB",
            help="Recycle a worker process whose resident memory passes MB MiB (looked at "
            "every second), as --max-jobs does.",
        )
        parser.add_argument("--supervisor", default="", help=argparse.SUPPRESS)
        # The write end of the pipe to the supervisor (worker.beacon).
        parser.add_argument("--beacon", type=int, default=None, help=argparse.SUPPRESS)

    def handle(
        self,
        *,
        queues: list[QueueSpec],
        databases: list[str],
        concurrency: int | None,
        async_concurrency: int | None,
        burst: bool,
        shutdown_timeout: float | None,
        poll_interval: float | None,
        no_scheduler: bool,
        metrics_port: int | None,
        health_file: str | None,
        verbosity: int,
        processes: int | None = None,
        max_jobs: int | None = None,
        max_memory: int | None = None,
        supervisor: str = "",
        beacon: int | None = None,
        isolate_queues: list[str] | None = None,
        **options: Any,
    ) -> None:
        _check_options(queues)
        queues = _isolating(queues, isolate_queues or [])
        aliases = _served(databases)
        _configure_logging(verbosity)
        count = 1 if supervisor else processes or conf.processes()
        if not supervisor and (processes is not None or count > 1 or len(aliases) > 1):
            self._supervise(count, burst, metrics_port, health_file, aliases)
            return
        try:
            to_supervisor = Beacon(beacon)
            limits = Limits(
                max_jobs=max_jobs,
                max_memory_mb=max_memory,
                supervisor_pid=processes_as_child(supervisor),
            )
            worker = WorkerProcess(
                queues,
                concurrency=concurrency,
                async_concurrency=async_concurrency,
                burst=burst,
                shutdown_timeout=shutdown_timeout,
                poll_interval=poll_interval,
                alias=aliases[0],
                scheduler=False if no_scheduler else None,
                limits=limits,
                supervisor=supervisor,
                beacon=to_supervisor,
            )
        except ValueError as exc:
            raise CommandError(str(exc), returncode=2) from None
        _observe(worker, metrics_port, health_file, child=bool(supervisor))
        try:
            code = worker.run()
        except (SchemaMissing, ReadOnlyDatabase) as exc:
            raise CommandError(str(exc)) from None
        _exit(worker, code, supervisor)

    def execute(self, *args: Any, **options: Any) -> str | None:
        self._options = options  # all of them, for the worker processes of a supervisor
        return super().execute(*args, **options)

    def _supervise(
        self,
        count: int,
        burst: bool,
        metrics_port: int | None,
        health_file: str | None,
        aliases: list[str],
    ) -> None:
        """Run ``count`` worker processes with this command's options, for each job
        database in ``aliases`` when there are several. With metrics, the supervisor
        serves one endpoint that sums its workers' (prometheus_client's multiprocess
        mode: each worker writes its figures to a directory they share)."""
        parser = self.create_parser("manage.py", "gator_worker")
        port = conf.metrics_port() if metrics_port is None else metrics_port
        directory = server = None
        try:
            health.configure(health_file)  # checked here too: a bad path fails at once
            if port is not None:
                directory = metrics.prepare_multiprocess_dir()
                server = metrics.serve(port)
                logging.getLogger("django_gator.worker").info(
                    "Serving the metrics of every worker process port=%s", server.port
                )
        except (ValueError, metrics.MetricsUnavailable) as exc:
            if directory is not None:
                metrics.remove_multiprocess_dir(directory)
            raise CommandError(str(exc), returncode=2) from None
        options = {**self._options, "metrics_port": None}  # the workers do not serve
        several = len(aliases) > 1  # each worker is then given its database
        arguments = child_arguments(
            parser, options, (*SUPERVISOR_ONLY, "databases") if several else SUPERVISOR_ONLY
        )
        try:
            ProcessSupervisor(
                count,
                arguments,
                burst=burst,
                on_exit=metrics.mark_dead if directory else None,
                health_file=health_file,
                databases=aliases if several else (),
            ).run()
        finally:
            if server is not None:
                server.close()
            if directory is not None:
                metrics.remove_multiprocess_dir(directory)


def _check_options(queues: list[QueueSpec]) -> None:
    """Refuse a queue listed twice, and bad settings."""
    seen: set[str] = set()
    for spec in queues:
        if spec.name in seen:
            raise CommandError(f"queue {spec.name!r} is listed twice", returncode=2)
        seen.add(spec.name)
    # The system checks ran already unless skipped (--skip-checks, call_command): the
    # settings are checked here too, so a bad one never waits for its first use.
    bad = settings_problems(deep=False)
    if bad:
        raise CommandError("; ".join(f"{p.message} ({p.hint})" for p in bad), returncode=2)


def _isolating(queues: list[QueueSpec], names: list[str]) -> list[QueueSpec]:
    """``queues`` with those named by --isolate-queue marked isolated; CommandError for a
    name that is not one of them."""
    listed = {spec.name for spec in queues}
    for name in names:
        if name not in listed:
            raise CommandError(
                f"--isolate-queue {name!r} is not one of this worker's queues "
                f"({', '.join(sorted(listed)) or 'none listed: add -q ' + name})",
                returncode=2,
            )
    return [dataclasses.replace(s, isolated=s.name in names) for s in queues]


def _served(databases: list[str]) -> list[str]:
    """The job databases this worker serves (``--database``; default: every one), each
    checked to be one; a clear error names a bad one."""
    try:
        known = job_databases()
    except ValueError as exc:  # a bad GATOR_QUEUE_DATABASES (InvalidSetting)
        raise CommandError(str(exc), returncode=2) from None
    served: list[str] = []
    for alias in databases:
        if alias not in known:
            raise CommandError(
                f"--database {alias!r} is not a job database: serve GATOR_DATABASE or an alias "
                f"GATOR_QUEUE_DATABASES routes queues to ({', '.join(map(repr, known))})",
                returncode=2,
            )
        if alias in served:
            raise CommandError(f"--database {alias!r} is listed twice", returncode=2)
        served.append(alias)
    return served or known


def _exit(worker: WorkerProcess, code: int, supervisor: str) -> None:
    """End the command after the worker stopped: with EXIT_RECYCLED for a supervisor's
    worker that recycled, and without waiting for threads still in user code."""
    strays = [t for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()]
    if strays:
        # A job started a thread that is not a daemon and never ended it: Python would
        # wait for it at exit, and the stopped worker would live on.
        logging.getLogger("django_gator.worker").warning(
            "Exiting past threads that jobs started and left running threads=%s",
            safe(",".join(t.name for t in strays)),
        )
    if worker.recycled and supervisor and not code:
        code = EXIT_RECYCLED  # the supervisor starts a fresh process
    if worker.forced_exit or strays:
        # Executor threads may still be inside user code; leave without waiting for
        # them. Their jobs were handed back to `waiting` before this point.
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(code)
    if code:
        sys.exit(code)


def processes_as_child(supervisor: str) -> int | None:
    """The supervisor's pid for a worker it started (``--supervisor``), else None."""
    if not supervisor:
        return None
    try:
        return as_child(supervisor)
    except ValueError as exc:
        raise CommandError(str(exc), returncode=2) from None


def _observe(
    worker: WorkerProcess, port: int | None, health_file: str | None, *, child: bool = False
) -> None:
    """Start the health file and the metrics endpoint; a clear error when either cannot.
    A worker process of a ``--processes`` supervisor serves nothing: with metrics on, it
    writes its figures where the supervisor's endpoint reads them."""
    try:
        health.configure(health_file)
        if child:
            if metrics.multiprocess_dir() is not None:
                metrics.enable()
                metrics.track(worker.concurrency, lambda: len(worker.slots.running))
            return
        if port is None:
            port = conf.metrics_port()
        if port is not None:
            metrics.enable()
            served = metrics.serve(port)
            logging.getLogger("django_gator.worker").info("Serving metrics port=%s", served.port)
            metrics.track(worker.concurrency, lambda: len(worker.slots.running))
    except (ValueError, metrics.MetricsUnavailable) as exc:
        raise CommandError(str(exc), returncode=2) from None


def _configure_logging(verbosity: int) -> None:
    """Show the worker's log lines unless the project's LOGGING already routes them."""
    logger = logging.getLogger("django_gator")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))
