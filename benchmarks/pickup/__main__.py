"""``python -m benchmarks.pickup``: pickup latency across processes, as deployed.

A ``manage.py gator_worker`` process (the package's default settings) works on the queue
``pickup``; this process dispatches one job at a time, each in its own transaction, and
takes the moment of its commit (an ``on_commit`` callback registered before the dispatch,
so it runs before any of the dispatch's own); the job sends the moment ``handle()`` starts
back over UDP. Between two jobs the dispatcher waits a random 20-100 ms, so the worker is
idle when each job arrives. Both ends read ``time.time()`` on the same machine.

For each ``--concurrency`` the modes given with ``--modes`` run one after another
(A/B/A/B): ``on`` (the default settings: LISTEN on PostgreSQL, wakeup datagrams elsewhere),
``off`` (``GATOR_WAKEUP_BIND = None``: on SQLite and MariaDB the poll of before this
change; on PostgreSQL the same as ``on``) and ``datagrams`` (``GATOR_NOTIFY = False`` in
the worker and in this process: on PostgreSQL the wakeup datagrams instead of NOTIFY;
elsewhere the same as ``on``). The worker counts its own SQL statements (a
Django execute wrapper installed by this benchmark's app), which gives its database load
while idle (10 s without jobs) and during the samples.

``--probe row``: the job writes one row (through Django's connection, as users' jobs do)
and reports the moment it is committed, so a connect the job's thread pays shows; ``udp``
(the default) reports the moment ``handle()`` starts. ``--warmup N``: jobs run before the
samples (default 5); ``--warmup 0`` measures from the worker's start, so each of the first
jobs lands on an executor thread that has run none yet (their median and maximum are
printed as "first p50" and "first max").

``--finished N``: before each run the jobs table is vacuumed (PostgreSQL), then ``N`` jobs
of the queue are dispatched and marked succeeded with no vacuum after them: the index
entries of rows that left the ready state, which a claim steps over until vacuum removes
them (on the shared server of these machines, autovacuum is off). The rows are made with
``dispatch_many`` and one UPDATE, not run: what a claim meets is the same.

The database named by ``--database-url`` must have ``pickup`` in its name (its jobs are
deleted); PostgreSQL and MariaDB databases are created if missing. Without a URL, SQLite in
a temporary file.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[2]
IDLE_WINDOW = 10.0


def create_database(url: str) -> None:
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if "pickup" not in name:
        raise SystemExit(
            f"the database name must contain 'pickup' (its jobs are deleted): {name!r}"
        )
    if parts.scheme.startswith("postgres"):
        import psycopg

        maintenance = urlunsplit(parts._replace(path="/postgres"))
        with psycopg.connect(maintenance, autocommit=True) as connection:
            found = connection.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [name]
            ).fetchone()
            if not found:
                connection.execute(f'CREATE DATABASE "{name}"')
    elif parts.scheme.startswith("mysql"):
        import MySQLdb

        connection = MySQLdb.connect(
            host=parts.hostname or "127.0.0.1", port=parts.port or 3306, user=parts.username
        )
        connection.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4")
        connection.close()


def child_env(url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="benchmarks.pickup.settings",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


class Run:
    """One worker process in one mode at one concurrency."""

    def __init__(self, url: str, mode: str, concurrency: int, workdir: Path) -> None:
        self.url = url
        self.mode = mode
        self.concurrency = concurrency
        self.reply = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.reply.bind(("127.0.0.1", 0))
        self.count_file = workdir / f"count-{mode}-{concurrency}"
        self.log = workdir / f"worker-{mode}-{concurrency}.log"
        host, port = self.reply.getsockname()
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "django",
                    "gator_worker",
                    "-q",
                    "pickup",
                    "--concurrency",
                    str(concurrency),
                    "--no-scheduler",
                ],
                cwd=ROOT,
                env=child_env(
                    url,
                    GATOR_PICKUP_REPLY=f"{host}:{port}",
                    GATOR_PICKUP_COUNT_FILE=str(self.count_file),
                    GATOR_PICKUP_WAKEUP=mode,
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def statements(self) -> int:
        try:
            return int(self.count_file.read_text() or 0)
        except (OSError, ValueError):
            return 0

    def wait_started(self) -> None:
        from django_gator.models import Worker

        deadline = time.monotonic() + 60
        while not Worker.objects.filter(pid=self.proc.pid).exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"worker did not start:\n{self.log.read_text()}")
            time.sleep(0.05)

    def one(self, job_class: Any) -> float:
        """Dispatch one job; milliseconds from its commit to its start."""
        from django.db import transaction

        stamp: list[float] = []
        with transaction.atomic():
            transaction.on_commit(lambda: stamp.append(time.time()))
            job = job_class.dispatch()
        self.reply.settimeout(30)
        while True:
            job_id, started = self.reply.recv(200).decode().split()
            if int(job_id) == job.pk:
                return (float(started) - stamp[0]) * 1000

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reply.close()


def xact_commits(vendor: str) -> int | None:
    """PostgreSQL: transactions committed in this database (pg_stat_database)."""
    if vendor != "postgresql":
        return None
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        return int(cursor.fetchone()[0])


def finish_jobs(count: int) -> None:
    """Vacuum the jobs table (PostgreSQL), then leave ``count`` jobs of the queue finished
    since: dispatched, then marked succeeded in one UPDATE per 100,000."""
    from django.db import connection

    from benchmarks.pickup.app.jobs import QUEUE, Noop
    from django_gator.models import Job, JobState

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM ANALYZE {Job._meta.db_table}")
    chunk = 100_000
    for start in range(0, count, chunk):
        jobs = Noop.dispatch_many([[] for _ in range(min(chunk, count - start))])
        Job.objects.filter(pk__gte=jobs[0].pk, pk__lte=jobs[-1].pk, queue=QUEUE).update(
            state=JobState.SUCCEEDED.value, attempts=1
        )


def ready_index_pages() -> int | None:
    """PostgreSQL: the pages of the claim's index (live and dead entries)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_relation_size('gator_job_ready') / 8192")
        return int(cursor.fetchone()[0])


def make_probe_table() -> None:
    """(Re)make the row-writing probe's table, empty."""
    from django.db import connection

    from benchmarks.pickup.app.jobs import PROBE_TABLE

    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {PROBE_TABLE}")
        cursor.execute(f"CREATE TABLE {PROBE_TABLE} (job_id BIGINT PRIMARY KEY, started FLOAT)")


def measure(
    url: str,
    mode: str,
    concurrency: int,
    samples: int,
    workdir: Path,
    finished: int = 0,
    probe: str = "udp",
    warmup: int = 5,
) -> dict[str, Any]:
    from django.conf import settings
    from django.db import connection

    from benchmarks.pickup.app.jobs import QUEUE, Stamp, Touch
    from django_gator.models import Job

    job_class = Touch if probe == "row" else Stamp
    settings.GATOR_NOTIFY = mode != "datagrams"  # the dispatching side, as the worker's
    Job.objects.filter(queue=QUEUE).delete()
    make_probe_table()
    finish_jobs(finished)
    run = Run(url, mode, concurrency, workdir)
    try:
        run.wait_started()
        time.sleep(1.0)
        for _ in range(warmup):  # warm up: imports, connections of the executor threads
            run.one(job_class)
            time.sleep(0.05)
        before = run.statements()
        begun = time.monotonic()
        latencies = []
        for _ in range(samples):
            time.sleep(random.uniform(0.02, 0.1))
            latencies.append(run.one(job_class))
        busy = time.monotonic() - begun
        time.sleep(1.0)  # the last success mark, and the poll's back-off
        during = (run.statements() - before) / busy
        idle_from = run.statements()
        commits_from = xact_commits(connection.vendor)
        time.sleep(IDLE_WINDOW)
        idle = (run.statements() - idle_from) / IDLE_WINDOW
        commits_to = xact_commits(connection.vendor)
    finally:
        run.stop()
    result = {
        "mode": mode,
        "probe": probe,
        "warmup": warmup,
        "concurrency": concurrency,
        "samples": samples,
        "finished_since_vacuum": finished,
        "ready_index_pages": ready_index_pages(),
        "p50_ms": statistics.median(latencies),
        # The first `concurrency` samples: with --warmup 0, each lands on an executor
        # thread that has run no job yet (threads take jobs in turn while idle).
        "first_p50_ms": statistics.median(latencies[:concurrency]),
        "first_max_ms": max(latencies[:concurrency]),
        "p90_ms": percentile(latencies, 90),
        "p99_ms": percentile(latencies, 99),
        "max_ms": max(latencies),
        "statements_per_s_during": during,
        "statements_per_s_idle": idle,
    }
    if commits_from is not None and commits_to is not None:
        # Everything committed in the database in the idle window (this process's two
        # reads included).
        result["xact_commit_per_s_idle"] = (commits_to - commits_from) / IDLE_WINDOW
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("PICKUP_DATABASE_URL"))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[2, 16, 32])
    parser.add_argument(
        "--modes", nargs="+", default=["on", "off"], choices=["on", "off", "datagrams"]
    )
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1, help="repeat the whole A/B set")
    parser.add_argument(
        "--finished",
        type=int,
        nargs="+",
        default=[0],
        help="jobs finished since the last vacuum before each run (see above)",
    )
    parser.add_argument("--probe", choices=["udp", "row"], default="udp")
    parser.add_argument("--warmup", type=int, default=5, help="jobs before the samples")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="gator-pickup-"))
    url = args.database_url or f"sqlite:///{workdir / 'pickup.sqlite3'}"
    if not url.startswith("sqlite"):
        create_database(url)
    os.environ.update(child_env(url))
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v0"],
        cwd=ROOT,
        env=child_env(url),
        check=True,
    )
    import django

    django.setup()
    from django.db import connection

    connection.ensure_connection()
    version = ".".join(map(str, connection.get_database_version()))
    print(
        f"pickup latency across processes: {connection.vendor} {version}, Django "
        f"{django.get_version()}, Python {platform.python_version()}, {os.cpu_count()} CPUs; "
        f"{args.samples} samples per run; probe {args.probe}, {args.warmup} jobs of warm-up"
    )
    print(
        f"{'finished':>9} {'mode':>4} {'threads':>7} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7}"
        f" {'max ms':>7} {'first p50':>9} {'first max':>9} {'SQL/s idle':>10} {'SQL/s sparse':>15}"
    )
    results = []
    for _ in range(args.rounds):
        for finished, concurrency, mode in itertools.product(
            args.finished, args.concurrency, args.modes
        ):
            r = measure(
                url,
                mode,
                concurrency,
                args.samples,
                workdir,
                finished,
                probe=args.probe,
                warmup=args.warmup,
            )
            r["database"] = f"{connection.vendor} {version}"
            results.append(r)
            extra = (
                f" (xact_commit/s idle {r['xact_commit_per_s_idle']:.1f})"
                if "xact_commit_per_s_idle" in r
                else ""
            )
            print(
                f"{finished:>9,} {mode:>4} {concurrency:>7} {r['p50_ms']:>7.2f}"
                f" {r['p90_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['max_ms']:>7.1f}"
                f" {r['first_p50_ms']:>9.2f} {r['first_max_ms']:>9.1f}"
                f" {r['statements_per_s_idle']:>10.1f}"
                f" {r['statements_per_s_during']:>15.1f}{extra}",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
