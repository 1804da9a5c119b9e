"""``python -m benchmarks.soak``: steady load for a set time against real worker processes,
and a report per minute of what the issue-15 operator watched.

The harness dispatches jobs at a fixed rate (a mix that mostly succeeds; some fail and
retry, some end dead, some time out, a few are slow; and this round's features: a keyed
class with a concurrency and a rate limit, a queue with a concurrency limit, async jobs,
jobs that snooze once, batches with on_complete and on_success callbacks, workflows; see
features.py) to 1 to 3 ``manage.py gator_worker`` processes, each serving ``/metrics``,
with automatic pruning on (a short retention, ``--prune-after``), and every minute records:

- claim and success-mark latency, p50/p99: each worker statement timed in the worker
  process by a Django execute wrapper that the soak's settings install (nothing in
  django_gator changes; see app/timing.py), plus an EXPLAIN (ANALYZE, BUFFERS) probe of the
  same engine calls from the harness every few seconds (execution time and buffers, which
  do not depend on how busy the machine is), plus pg_stat_statements on a throwaway cluster;
- drain lag: jobs due and waiting, and the age of the oldest of them;
- the jobs table: rows by state, live and dead tuples (pg_stat_user_tables), vacuums, sizes;
- each worker's RSS and thread count (/proc/PID/status);
- CPU time of the workers' database backends (/proc/PID/stat of the PostgreSQL backends,
  told apart by application_name), per minute and per finished job;
- each worker's /metrics (answered? finished-jobs counters), the rows of the tables this
  round added (batches, workflows, the rate-limit ledger) and the rows pruned so far.

At the end it waits for every job to end, then checks (exit status 1 if one fails): every
job dispatched ended, once, in the state its kind ends in (counting the rows the pruner
deleted); each batch's callbacks ran exactly once; each workflow's steps ran once, in
dependency order; no concurrency or rate limit was exceeded; the jobs table stayed bounded
and the rate-limit ledger within its windows; /metrics answered and its counts match the
database; worker RSS and threads, claim and mark latency, flat (first against last ten
minutes).

``--long-transaction`` holds a REPEATABLE READ transaction open on the jobs table for the
whole run and reports the workers' backend CPU per job over consecutive windows of
``--window`` succeeded jobs. ``--cluster throwaway`` runs on a temporary cluster (initdb,
own port, autovacuum on with the per-table settings of cluster.TABLE_AUTOVACUUM).

The database named by ``--database-url`` is dropped and re-created: its name must contain
``soak``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.soak import day, dayrun, features, measure
from benchmarks.soak.app.timing import CLAIM_KINDS
from benchmarks.soak.cluster import (
    TABLE_AUTOVACUUM,
    ThrowawayCluster,
    end_on_sigterm,
    recreate_database,
    server_facts,
)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/gator_soak"
DEFAULT_MIX = (
    "ok=65,retry=3,dead=0.5,timeout=0.5,slow=1,keyed=8,limited=3,async=6,snooze=3,batch=8,"
    "workflow=2"
)
#: Seconds between two dispatches of the jobs due by the rate.
TICK = 0.05
#: The EXPLAIN probes (see Soak.probe).
PROBES = ("claim", "mark", "mark1", "queues")


def duration(text: str) -> float:
    """'90', '90s', '30m' or '2h' as seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if text and text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 30m, 2h)") from None


#: The job kinds of a mix (app/jobs.py KINDS).
KINDS = (
    "ok",
    "retry",
    "dead",
    "timeout",
    "slow",
    "keyed",
    "limited",
    "async",
    "snooze",
    "batch",
    "workflow",
)


def mix(text: str) -> dict[str, float]:
    weights: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, weight = part.partition("=")
        if name not in KINDS:
            known = ", ".join(KINDS)
            raise argparse.ArgumentTypeError(f"unknown job kind {name!r}; known: {known}")
        try:
            weights[name] = float(weight)
        except ValueError:
            raise argparse.ArgumentTypeError(f"weight must be a number: {part!r}") from None
    if not weights or sum(weights.values()) <= 0:
        raise argparse.ArgumentTypeError(f"empty mix: {text!r}")
    return weights


def retention(text: str) -> float | None:
    """A duration, or 'off' (None)."""
    return None if text == "off" else duration(text)


def workers(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 3:
        raise argparse.ArgumentTypeError(f"1 to 3 workers, got {value}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--duration", type=duration, default=None, help="e.g. 30m (default 30m)")
    p.add_argument("--rate", type=float, default=None, help="jobs/s (default 200; 50 with -L)")
    p.add_argument("--workers", type=workers, default=2, help="worker processes, 1-3")
    p.add_argument("--concurrency", type=int, default=8, help="threads per worker")
    p.add_argument("--mix", type=mix, default=None, help=f"default {DEFAULT_MIX}; ok=100 with -L")
    p.add_argument("--database-url", default=DEFAULT_URL, help="dropped and re-created")
    p.add_argument("--cluster", choices=["shared", "throwaway"], default="shared")
    p.add_argument("--port", type=int, default=5499, help="port of the throwaway cluster")
    p.add_argument("--pg-bindir", default="/usr/lib/postgresql/15/bin")
    p.add_argument(
        "--table-autovacuum",
        choices=["recommended", "default"],
        default="recommended",
        help="throwaway cluster: the jobs table's autovacuum settings (cluster.TABLE_AUTOVACUUM) "
        "or PostgreSQL's defaults",
    )
    p.add_argument(
        "--prefill",
        type=int,
        default=0,
        metavar="N",
        help="start with N succeeded jobs in the table (a table with history), then ANALYZE",
    )
    p.add_argument(
        "-L",
        "--long-transaction",
        action="store_true",
        help="hold a REPEATABLE READ transaction open; one worker; CPU per job per window",
    )
    p.add_argument("--window", type=int, default=6000, help="jobs per window (with -L)")
    p.add_argument("--windows", type=int, default=5, help="windows (with -L)")
    p.add_argument("--out", type=Path, help="JSON report (default benchmarks/results/...)")
    p.add_argument("--chart", type=Path, help="PNG chart (default docs/soak-<cluster>.png)")
    p.add_argument("--no-chart", action="store_true")
    p.add_argument("--chart-only", type=Path, metavar="JSON", help="redraw a report's chart")
    p.add_argument(
        "--markdown", type=Path, metavar="JSON", help="print a report's table for the docs"
    )
    p.add_argument("--probe-interval", type=float, default=10.0, help="seconds between probes")
    p.add_argument(
        "--prune-after",
        type=retention,
        default=None,
        help="automatic pruning's retention of succeeded and cancelled jobs, or 'off' "
        "(default 5m; off with -L)",
    )
    p.add_argument(
        "--prune-interval", type=duration, default=60.0, help="between pruning passes (60s)"
    )
    p.add_argument(
        "--accounts",
        type=int,
        default=None,
        help="accounts active at a time (keyed jobs; default 50, or more where the rate "
        "would offer them more than 70 %% of their rate limit)",
    )
    p.add_argument("--no-metrics", action="store_true", help="workers without --metrics-port")
    p.add_argument(
        "--census",
        type=duration,
        default=0.0,
        metavar="SECONDS",
        help="each worker counts its objects by type every SECONDS (app/census.py); the "
        "report names the types that grew after the first ten minutes (default: off)",
    )
    p.add_argument(
        "--census-trace",
        action="store_true",
        help="with --census: tracemalloc in the workers, and the source lines whose "
        "allocations grew (slows the workers)",
    )
    p.add_argument(
        "--drain-timeout",
        type=duration,
        default=300.0,
        help="after the dispatching stops, how long every job has to end (300s)",
    )
    p.add_argument("--seed", type=int, default=15)
    dayrun.arguments(p)
    return p


class Soak:
    def __init__(self, args: argparse.Namespace, url: str, cluster: ThrowawayCluster | None):
        self.args = args
        self.url = url
        self.cluster = cluster
        self.long_tx = args.long_transaction
        self.rate: float = args.rate or (50.0 if self.long_tx else 200.0)
        self.mix: dict[str, float] = args.mix or mix("ok=100" if self.long_tx else DEFAULT_MIX)
        if args.duration is not None:
            self.duration: float = args.duration
        else:
            # With -L the run ends after its windows; the duration is only a bound.
            self.duration = 4 * 3600 if self.long_tx else 1800
        self.log_dir = Path(tempfile.mkdtemp(prefix="gator-soak-"))
        self.timing_dir = self.log_dir / "timings"
        self.timing_dir.mkdir()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.dispatched = 0
        self.started = 0.0  # time.time() when dispatching began: minute 0
        self.stop = threading.Event()
        self.sampler_error: BaseException | None = None
        self.minutes: list[dict[str, Any]] = []
        self.windows: list[dict[str, Any]] = []
        self.probes: list[tuple[float, str, dict[str, Any]]] = []
        self.meta: dict[str, Any] = {}
        self.reader = measure.TimingReader(self.timing_dir, 0.0, keep_raw=self.long_tx)
        self.cpu = measure.BackendCpu()
        self.windows_done = threading.Event()
        if args.prune_after is not None:
            self.prune_after: float | None = args.prune_after
        else:
            self.prune_after = None if self.long_tx else 300.0
        self.metrics_ports: list[int] = []
        self.web = dayrun.WebFleet(self, args)
        accounts, limited_ms = features.flow_sizing(
            self.rate * (1 - self.web.share), self.mix, args.accounts, _flow_limits()
        )
        self.mixer = features.Mixer(
            random.Random(args.seed), accounts=accounts, limited_ms=limited_ms
        )
        self.checks: list[features.Check] = []
        self.vacuums = day.VacuumCounts()
        self.partition_ledger = day.PartitionLedger()
        self.postmaster = day.postmaster_pid(cluster.data) if cluster is not None else None

    # -- processes -------------------------------------------------------------------------
    def worker_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DATABASE_URL": self.url,
            "DJANGO_SETTINGS_MODULE": "benchmarks.soak.settings",
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            "GATOR_SOAK_ROLE": "worker",
            "GATOR_SOAK_TIMINGS": str(self.timing_dir),
            "GATOR_SOAK_PRUNE_AFTER": "off"
            if self.prune_after is None
            else f"{self.prune_after:g}",
            "GATOR_SOAK_PRUNE_INTERVAL": f"{self.args.prune_interval:g}",
            "GATOR_SOAK_CENSUS": f"{self.args.census:g}" if self.args.census else "",
            "GATOR_SOAK_CENSUS_TRACE": "1" if self.args.census_trace else "",
            "GATOR_SOAK_PARTITIONING": (
                "" if self.args.partitioning == "none" else self.args.partitioning
            ),
            "GATOR_SOAK_NOTIFY": self.args.notify,
        }

    def spawn(self, index: int) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "django", "gator_worker"]
        command += ["--concurrency", str(self.args.concurrency)]
        if not self.args.no_metrics:
            port = free_port()
            self.metrics_ports.append(port)
            command += ["--metrics-port", str(port)]
        with (self.log_dir / f"worker-{index}.log").open("wb") as out:
            return subprocess.Popen(
                command, cwd=ROOT, env=self.worker_env(), stdout=out, stderr=subprocess.STDOUT
            )

    def wait_registered(self, count: int) -> None:
        from django_gator.models import Worker

        deadline = time.monotonic() + 60
        while Worker.objects.count() < count:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a worker exited at start-up; see {self.log_dir}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers did not register within 60 s; see {self.log_dir}")
            time.sleep(0.2)

    def stop_workers(self) -> list[int | None]:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=90))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                codes.append(None)
        return codes

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        from django.db import connection

        from django_gator.engines import get_engine

        self.engine = get_engine("default")
        with connection.cursor() as cursor:
            self.meta = self.describe(cursor)
            horizon = measure.horizon(cursor)
        self.meta["horizon_at_start"] = horizon
        if horizon["oldest_xact_s"] > 60:
            print(
                f"WARNING: a transaction in database {horizon.get('database')!r} has been open "
                f"for {horizon['oldest_xact_s']:.0f} s ({horizon.get('state')}); until it ends no "
                "dead index entry can be removed, in any database, and the figures will show it",
                flush=True,
            )
        workers = 1 if self.long_tx else self.args.workers
        self.procs = [self.spawn(i) for i in range(workers)]
        held = None
        try:
            self.wait_registered(workers)
            if self.long_tx:
                held = self.hold_transaction()
            self.started = time.time()
            self.reader.started = self.started
            self.web.start()
            sampler = threading.Thread(target=self.sample_loop, name="soak-sampler")
            sampler.start()
            try:
                self.dispatch_loop()
                self.web.wait()
            finally:
                self.stop.set()
                sampler.join()
                self.web.kill()
            if self.sampler_error is not None:
                raise self.sampler_error
            drain_s = self.wait_drained(timeout=self.args.drain_timeout)
            ended_s = self.wait_ended(timeout=self.args.drain_timeout)
            time.sleep(3.0)  # the workers count an outcome just after writing it
            final_metrics = [features.scrape(port) for port in self.metrics_ports]
            codes = self.stop_workers()
        finally:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            if held is not None:
                held.close()
        with connection.cursor() as cursor:
            if self.args.partitioning != "none":
                # A partition dropped during the drain (past retention meanwhile) is noticed,
                # its rows counted as pruned: without this look a run that crossed an hour
                # near its end missed them in the census below.
                dayrun.sample_partitions(self, cursor)
            cursor.execute(
                "SELECT state, count(*) FROM django_gator_job GROUP BY state ORDER BY state"
            )
            final_states = dict(cursor.fetchall())
            counts = features.outcome_counts(cursor)
        day.add_dropped(counts, self.partition_ledger.dropped_counts())
        self.checks = self.web.checks(self.reader)
        self.checks += features.check_outcomes(self.mixer.expected, counts)
        if self.metrics_ports:
            self.checks += features.check_metrics(final_metrics, counts, self.minutes)
        if self.mixer.batches:
            self.checks += features.check_batches(self.mixer.batches)
        if self.mixer.workflows:
            self.checks += features.check_workflows(self.mixer.workflows)
        if self.mixer.expected["soak.keyed"] or self.mixer.expected["soak.limited"]:
            from benchmarks.soak.app import jobs
            from django_gator.limits import parse_rate

            rate = parse_rate(jobs.KEY_RATE)
            assert rate is not None
            self.checks += features.check_limits(
                jobs.KEY_CONCURRENCY, jobs.LIMITED_CONCURRENCY, (rate.starts, rate.seconds)
            )
        self.meta["final_metrics"] = final_metrics
        self.meta["expected"] = dict(self.mixer.expected)
        self.meta["outcomes"] = counts
        return self.report(codes, drain_s, final_states, ended_s)

    def describe(self, cursor: Any) -> dict[str, Any]:
        import django

        meta = {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": " ".join(shlex.quote(a) for a in sys.argv),
            "git_commit": _git("rev-parse", "--short", "HEAD"),
            "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
            "machine": {
                "cpus": os.cpu_count(),
                "arch": platform.machine(),
                "kernel": platform.release(),
                "mem_gib": round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30),
                "loadavg_at_start": measure.loadavg(),
            },
            "python": platform.python_version(),
            "django": django.get_version(),
            "server": server_facts(cursor),
            "cluster": self.args.cluster,
            "database": self.url.rsplit("@", 1)[-1],
            "rate": self.rate,
            "duration_s": self.duration,
            "workers": 1 if self.long_tx else self.args.workers,
            "concurrency": self.args.concurrency,
            "mix": self.mix,
            "long_transaction": self.long_tx,
            "table_autovacuum": (
                TABLE_AUTOVACUUM
                if self.cluster and self.args.table_autovacuum == "recommended"
                else None
            ),
            "prefill": self.args.prefill,
            "partitioning": self.args.partitioning,
            "notify": self.args.notify,
            "web_processes": self.web.count,
            "web_share": self.web.share,
            "web_ways": self.args.web_ways,
            "prune_after_s": self.prune_after,
            "prune_interval_s": self.args.prune_interval,
            "accounts": self.mixer.accounts,
            "limited_ms": list(self.mixer.limited_ms),
            "metrics_ports": self.metrics_ports,
            "latency_source": (
                "worker-side: each claim and success-mark statement timed in the worker "
                "process by a Django execute wrapper (round trip + server + GIL wait)"
            ),
            "probe": (
                f"EXPLAIN (ANALYZE, BUFFERS) of engine.claim(queue, 1) and of the batched "
                f"success mark over 8 finished jobs, every {self.args.probe_interval:g} s, "
                "rolled back"
            ),
            "log_dir": str(self.log_dir),
        }
        return meta

    def hold_transaction(self) -> Any:
        """The long read transaction of issue 15, on a connection of its own."""
        import psycopg

        held = psycopg.connect(self.url, application_name="gator-soak-long-transaction")
        held.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        count = held.execute("SELECT count(*) FROM django_gator_job").fetchone()
        self.meta["long_transaction_rows_seen"] = count[0] if count else None
        return held

    def dispatch_loop(self) -> None:
        """Dispatch the mix at the rate (see features.Mixer for the kinds gathered into
        bursts, batches and workflows)."""
        rng = random.Random(self.args.seed)
        names = list(self.mix)
        weights = [self.mix[n] for n in names]
        start = time.monotonic()
        self.mixer.started = start
        end = start + self.duration
        units = 0
        while not self.windows_done.is_set():
            now = time.monotonic()
            if now >= end:
                break
            due = int(self.rate * (1 - self.web.share) * (now - start)) - units
            if due > 0:
                self.mixer.add(rng.choices(names, weights, k=due))
                units += due
                self.dispatched = self.mixer.dispatched
            if self.sampler_error is not None:
                return
            time.sleep(max(TICK - (time.monotonic() - now), 0.0))
        self.mixer.flush()
        self.dispatched = self.mixer.dispatched

    def wait_ended(self, timeout: float) -> float | None:
        """Seconds until no job is waiting, failed or running (None: not within timeout):
        retries and snoozes due later, and the callbacks and workflow steps the last jobs
        dispatch."""
        from django.db import connection

        started = time.monotonic()
        while time.monotonic() - started < timeout:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM django_gator_job WHERE state IN "
                    "('waiting', 'failed', 'running')"
                )
                if cursor.fetchone()[0] == 0:
                    return round(time.monotonic() - started, 1)
            time.sleep(1.0)
        return None

    def wait_drained(self, timeout: float) -> float | None:
        """Seconds until nothing due is waiting and nothing runs (None: not within timeout)."""
        from django.db import connection

        started = time.monotonic()
        while time.monotonic() - started < timeout:
            with connection.cursor() as cursor:
                due, _ = measure.backlog(cursor)
                cursor.execute("SELECT count(*) FROM django_gator_job WHERE state = 'running'")
                running = cursor.fetchone()[0]
            if due == 0 and running == 0:
                return round(time.monotonic() - started, 1)
            time.sleep(1.0)
        return None

    # -- sampling --------------------------------------------------------------------------
    def sample_loop(self) -> None:
        from django.db import connection

        try:
            self._sample_loop()
        except BaseException as exc:
            self.sampler_error = exc
            raise
        finally:
            connection.close()

    def _sample_loop(self) -> None:
        from django.db import connection

        interval = 1.0 if self.long_tx else 2.0
        minute = 0
        next_probe = time.time()
        state: dict[str, Any] = self._minute_state()
        with connection.cursor() as cursor:
            self.cpu.sample(measure.backend_roles(cursor))
            self.pgss = measure.pgss_snapshot(cursor) if self.cluster else {}
            self.window_base = (measure.succeeded_total(cursor), 0.0, time.time())
            self.window_pgss = self.pgss
            self.window_statements = measure.pgss_statements(cursor) if self.cluster else {}
            self.minute_statements = self.window_statements
        while True:
            now = time.time()
            with connection.cursor() as cursor:
                self.cpu.sample(measure.backend_roles(cursor))
                for i, proc in enumerate(self.procs):
                    status = measure.proc_status(proc.pid)
                    if status:
                        state["workers"][i].append(status)
                if now >= next_probe:
                    next_probe = now + self.args.probe_interval
                    self.probe(cursor, state)
                    if self.args.partitioning != "none":
                        dayrun.sample_partitions(self, cursor)
                if self.long_tx:
                    self.check_window(cursor)
            if now >= self.started + 60 * (minute + 1):
                self.close_minute(minute, state)
                minute += 1
                state = self._minute_state()
            if self.stop.is_set():
                break
            boundary = self.started + 60 * (minute + 1)  # wake up on it, for exact minutes
            self.stop.wait(max(min(now + interval, boundary) - time.time(), 0.01))
        # The last, partial minute is kept only if it lasted at least half a minute.
        if time.time() - (self.started + 60 * minute) >= 30:
            self.close_minute(minute, state, partial=True)

    def _minute_state(self) -> dict[str, Any]:
        return {
            "cluster_cpu": day.cluster_cpu(self.postmaster) if self.postmaster else None,
            "workers": defaultdict(list),
            "backlog": [],
            "free_backlog": [],
            "horizon": [],
            "probes": defaultdict(list),
            "dispatched": self.dispatched,
            "cpu": self.cpu.seconds(),
            "host": measure.host_cpu(),
        }

    def probe(self, cursor: Any, state: dict[str, Any]) -> None:
        from django.db import connection

        due, age = measure.backlog(cursor)
        state["backlog"].append((due, age))
        if connection.vendor == "postgresql":
            state["free_backlog"].append(day.free_backlog(cursor))
        state["horizon"].append(measure.horizon(cursor))
        if connection.vendor != "postgresql":
            return  # EXPLAIN (ANALYZE, BUFFERS) is PostgreSQL's
        results = {
            "claim": measure.probe_claim(connection, self.engine, "soak"),
            "mark": measure.probe_mark(connection, self.engine, 8),
            "mark1": measure.probe_mark(connection, self.engine, 1),
            "queues": measure.probe_queues(connection, self.engine),
        }
        now = time.time()
        for name, result in results.items():
            if result is not None:
                state["probes"][name].append(result)
                self.probes.append((now, name, result))

    def check_window(self, cursor: Any) -> None:
        """With -L: close a window each time another ``--window`` jobs have succeeded."""
        done = measure.succeeded_total(cursor)
        if done - self.window_base[0] < self.args.window or len(self.windows) >= self.args.windows:
            return
        self.cpu.sample(measure.backend_roles(cursor))
        cpu = self.cpu.seconds().get("worker", 0.0)
        now = time.time()
        base_done, base_cpu, base_t = self.window_base
        jobs = done - base_done
        self.reader.read()
        raw = [(k, us) for t, k, us in self.reader.raw if base_t <= t < now]
        window = {
            "window": len(self.windows) + 1,
            "jobs": jobs,
            "seconds": round(now - base_t, 1),
            "worker_db_cpu_s": round(cpu - base_cpu, 2),
            "worker_db_cpu_us_per_job": round((cpu - base_cpu) * 1e6 / jobs),
            "claim": measure.summarize([(us, 1) for k, us in raw if k in CLAIM_KINDS]),
            "mark": measure.summarize([(us, 1) for k, us in raw if k == "mark"]),
            # As the worker's thread waited for them: full claims and keyset claims apart,
            # with and without the success marks (the claimer chooses by these durations).
            "claims_by_kind": {
                kind: measure.summarize([(us, 1) for k, us in raw if k == kind])
                for kind in CLAIM_KINDS
            },
            "probe": _probe_medians([(n, r) for t, n, r in self.probes if base_t <= t < now]),
            "statements_per_job": {
                kind: round(sum(1 for k, _ in raw if k == kind) / jobs, 2)
                for kind in ("claim", "claim_keyset", "mark", "queues")
            },
        }
        if self.cluster is not None:
            pgss = measure.pgss_snapshot(cursor)
            window["pgss"] = measure.pgss_delta(self.window_pgss, pgss)
            self.window_pgss = pgss
            statements = measure.pgss_statements(cursor)
            window["statements"] = measure.pgss_top(self.window_statements, statements, jobs)
            self.window_statements = statements
        from django.db import connection

        window["claim_plan"] = measure.probe_claim(connection, self.engine, "soak", True)["text"]
        window["queues_plan"] = measure.probe_queues(connection, self.engine, True)["text"]
        self.windows.append(window)
        print(
            f"  window {window['window']}: {jobs} jobs in {window['seconds']} s, worker "
            f"backends {window['worker_db_cpu_s']} s CPU = "
            f"{window['worker_db_cpu_us_per_job']} us/job",
            flush=True,
        )
        self.window_base = (done, cpu, now)
        if len(self.windows) >= self.args.windows:
            self.windows_done.set()

    def close_minute(self, index: int, state: dict[str, Any], partial: bool = False) -> None:
        from django.db import connection

        start = datetime.fromtimestamp(self.started + 60 * index, UTC)
        end = datetime.fromtimestamp(min(self.started + 60 * (index + 1), time.time()), UTC)
        # Statements of the minute's last second may still be in the workers' buffers:
        # report() fills these fields again from the complete files.
        self.reader.read()
        bucket = self.reader.minute(index)
        with connection.cursor() as cursor:
            roles = measure.backend_roles(cursor)
            self.cpu.sample(roles)
            finished = measure.finished_between(cursor, start, end)
            table = measure.table_stats(cursor)
            pgss = measure.pgss_snapshot(cursor) if self.cluster else {}
            statements = measure.pgss_statements(cursor) if self.cluster else {}
            extra = features.tables(cursor, self.stale_after(), self.engine.now_sql)
        scrapes = [features.scrape(port) for port in self.metrics_ports]
        cpu_now = self.cpu.seconds()
        cpu = {
            role: round(seconds - state["cpu"].get(role, 0.0), 2)
            for role, seconds in cpu_now.items()
        }
        jobs = finished.get("succeeded", 0) + finished.get("dead", 0)
        busy0, total0 = state["host"]
        busy1, total1 = measure.host_cpu()
        backlog = state["backlog"] or [(0, 0.0)]
        record = {
            "minute": index + 1,
            "start": start.isoformat(timespec="seconds"),
            "partial": partial,
            "dispatched": self.dispatched - state["dispatched"],
            "finished": finished,
            **_timing_fields(bucket),
            "probe": _probe_medians([(n, r) for n, rs in state["probes"].items() for r in rs]),
            "pgss": measure.pgss_delta(self.pgss, pgss) if self.cluster else None,
            # The statements that took the most of the server's time this minute, any kind.
            "statements": (
                measure.pgss_top(self.minute_statements, statements, jobs, count=10, by="ms")
                if self.cluster
                else None
            ),
            "backlog": {
                "due_max": max(d for d, _ in backlog),
                "due_last": backlog[-1][0],
                "oldest_s_max": round(max(a for _, a in backlog), 2),
                "oldest_s_last": round(backlog[-1][1], 2),
            },
            "table": table,
            # The oldest other transaction on the server during the minute: it holds back
            # the cleanup of dead index entries in every database (see measure.horizon).
            "horizon": max(
                state["horizon"] or [{"oldest_xact_s": 0.0}], key=lambda h: h["oldest_xact_s"]
            ),
            "workers": [
                {
                    "pid": self.procs[i].pid,
                    "rss_mb": round(samples[-1]["rss_mb"], 1),
                    "rss_mb_max": round(max(s["rss_mb"] for s in samples), 1),
                    "threads": samples[-1]["threads"],
                    "threads_max": max(s["threads"] for s in samples),
                }
                for i, samples in sorted(state["workers"].items())
            ],
            "db_cpu_s": cpu,
            "features": extra,
            "metrics": [{k: v for k, v in s.items() if k != "finished"} for s in scrapes],
            # Open database connections by role at the minute's end (a leak would show).
            "backends": dict(Counter(role for _, role in roles)),
            "worker_db_cpu_us_per_job": (
                round(cpu.get("worker", 0.0) * 1e6 / jobs) if jobs and roles else None
            ),
            # The server's planning time of every statement (all roles), per job.
            "plan_us_per_job": (
                round(measure.planning_ms(self.minute_statements, statements) * 1000 / jobs)
                if self.cluster and jobs
                else None
            ),
            "host": {
                "cpu_busy_pct": round(100 * (busy1 - busy0) / max(total1 - total0, 1), 1),
                "loadavg": measure.loadavg(),
            },
        }
        with connection.cursor() as cursor:
            record.update(dayrun.minute_extras(self, cursor, record, bucket, state, end))
        self.pgss = pgss
        self.minute_statements = statements
        self.minutes.append(record)
        self.write(partial=True)
        claim, mark = record["claim"], record["mark"]
        print(
            f"  minute {record['minute']:>3}{' (partial)' if partial else ''}: dispatched "
            f"{record['dispatched']}, finished {jobs}, "
            f"claim p50/p99 {claim['p50']}/{claim['p99']} ms, mark {mark['p50']}/{mark['p99']} "
            f"ms, web dispatched {record.get('web_dispatched', 0)}, dispatch p50/p99 "
            f"{record['dispatch']['p50']}/{record['dispatch']['p99']} ms, "
            f"backlog {record['backlog']['due_last']}, dead tuples "
            f"{record.get('storage', table).get('n_dead_tup')}, RSS "
            + "/".join(f"{w['rss_mb']:.0f}" for w in record["workers"])
            + f" MiB, worker DB CPU {record['worker_db_cpu_us_per_job']} us/job, planning "
            f"{record['plan_us_per_job']} us/job",
            flush=True,
        )
        flow = extra["flow_start"]
        print(
            f"             rows {table.get('rows')} (pruned so far "
            f"{sum(extra['deleted_by_state'].values())}), flow ledger {flow['rows']} "
            f"({flow['stale_rows']} older than {flow['stale_after_s']:g} s), batches "
            f"{extra['django_gator_batch']}, workflows {extra['django_gator_workflow']}, "
            f"metrics finished "
            + "/".join(str(s.get("finished_total", "DOWN")) for s in scrapes)
            + f", flow lock p50/p99 {record['flow_lock']['p50']}/{record['flow_lock']['p99']} ms",
            flush=True,
        )

    def stale_after(self) -> float:
        """Rate-limit ledger rows older than this should be gone (see
        features.ledger_stale_after): the soak's longest window is the keyed class's."""
        from benchmarks.soak.app import jobs
        from django_gator.limits import parse_rate

        rate = parse_rate(jobs.KEY_RATE)
        window = rate.seconds if rate is not None else 0
        return features.ledger_stale_after(window, self.args.prune_interval)

    def row_bound(self) -> float | None:
        """Most rows (not dead) the jobs table should hold with pruning on."""
        if self.prune_after is None:
            return None
        span = day.PARTITION_SECONDS[self.args.partitioning]
        return self.rate * (self.prune_after + span + 1.5 * self.args.prune_interval + 120)

    # -- the report ------------------------------------------------------------------------
    def report(
        self,
        codes: list[int | None],
        drain_s: float | None,
        final_states: dict[str, int],
        ended_s: float | None = None,
    ) -> dict[str, Any]:
        self.reader.read()
        for record in self.minutes:
            record.update(_timing_fields(self.reader.minute(record["minute"] - 1)))
        full = [m for m in self.minutes if not m["partial"]]
        span = min(10, len(full) // 2) or 1
        first = [m["minute"] - 1 for m in full[:span]]
        last = [m["minute"] - 1 for m in full[-span:]]
        summary: dict[str, Any] = {
            "minutes": len(full),
            "compared_minutes": span,
            "dispatched": self.dispatched,
            "final_states": final_states,
            "drained_after_stop_s": drain_s,
            "ended_after_stop_s": ended_s,
            "worker_exit_codes": codes,
        }
        for name, kinds in (
            ("claim", CLAIM_KINDS),
            ("claim_full", ("claim",)),
            ("mark", ("mark",)),
        ):
            a = measure.pooled(self.reader, first, kinds)
            b = measure.pooled(self.reader, last, kinds)
            summary[name] = {
                "first": a,
                "last": b,
                "ratio_p50": _ratio(b["p50"], a["p50"]),
                "ratio_p99": _ratio(b["p99"], a["p99"]),
            }
        for name in PROBES:
            series = [m["probe"].get(name) for m in full]
            a = [p for p in series[:span] if p]
            b = [p for p in series[-span:] if p]
            if a and b:
                summary[f"probe_{name}"] = {
                    key: {
                        "first": statistics.median(p[key] for p in a),
                        "last": statistics.median(p[key] for p in b),
                    }
                    for key in ("ms", "buffers")
                }
        if full:
            for key in ("rss_mb", "threads"):
                summary[key] = [
                    {
                        "first": full[0]["workers"][i][key],
                        "last": full[-1]["workers"][i][key],
                        "max": max(m["workers"][i][f"{key}_max"] for m in full),
                    }
                    for i in range(len(full[0]["workers"]))
                ]
            summary["backlog_max"] = max(m["backlog"]["due_max"] for m in full)
            summary["oldest_due_s_max"] = max(m["backlog"]["oldest_s_max"] for m in full)
            summary["n_dead_tup_last"] = full[-1]["table"].get("n_dead_tup")
            summary["n_dead_tup_max"] = max(m["table"].get("n_dead_tup") or 0 for m in full)
            summary["autovacuum_count"] = full[-1]["table"].get("autovacuum_count")
            summary["rows_last"] = full[-1]["table"].get("rows")
        if self.cluster is not None:
            summary["autovacuum_log"] = self.cluster.autovacuum_log()[-40:]
        if self.long_tx:
            summary["windows"] = self.windows
            if len(self.windows) >= 2:
                summary["window_ratio_last_first"] = _ratio(
                    self.windows[-1]["worker_db_cpu_us_per_job"],
                    self.windows[0]["worker_db_cpu_us_per_job"],
                )
        self.checks.append(
            features.Check(
                "workers drained and exited 0",
                drain_s is not None and ended_s is not None and all(c == 0 for c in codes),
                f"nothing due or running {drain_s} s after the dispatching stopped, nothing "
                f"waiting {ended_s} s after that; exit codes {codes}",
            )
        )
        if not self.long_tx:
            self.checks += features.check_minutes(self.minutes, summary, self.row_bound())
            if self.web.count or self.args.partitioning != "none":
                self.checks += dayrun.day_checks(self, summary)
        if self.args.census:
            from benchmarks.soak.app.census import growth

            summary["census"] = {
                path.name: growth(path, after=600)
                for path in sorted(self.timing_dir.glob("census-*.jsonl"))
            }
        summary["checks"] = [c.as_dict() for c in self.checks]
        self.summary = summary
        self.write(partial=False)
        return summary

    def out_path(self) -> Path:
        if self.args.out:
            return Path(self.args.out)
        suffix = "-long-transaction" if self.long_tx else ""
        return ROOT / "benchmarks" / "results" / f"soak-{self.args.cluster}{suffix}.json"

    def write(self, *, partial: bool) -> None:
        document = {
            "meta": self.meta,
            "minutes": self.minutes,
            "summary": None if partial else self.summary,
        }
        path = self.out_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(document, indent=1, default=str) + "\n")
        tmp.replace(path)


def free_port() -> int:
    """A TCP port free now on 127.0.0.1 (for a worker's /metrics)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _timing_fields(bucket: dict[str, list[tuple[float, int]]]) -> dict[str, Any]:
    """The per-minute latency summaries of one minute's worker statement timings."""
    fields: dict[str, Any] = {
        "claim": measure.summarize([s for k in CLAIM_KINDS for s in bucket.get(k, [])])
    }
    for kind, name in (
        ("claim", "claim_full"),
        ("claim_keyset", "claim_keyset"),
        ("mark", "mark"),
        ("fail", "fail"),
        ("queues", "queues"),
        ("heartbeat", "heartbeat"),
        ("flow_lock", "flow_lock"),
        ("dispatch", "dispatch"),
        ("dispatch_many", "dispatch_many"),
    ):
        fields[name] = measure.summarize(bucket.get(kind, []))
    fields["rescues"] = len(bucket.get("rescue", []))
    return fields


def _probe_medians(results: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in PROBES:
        mine = [r for n, r in results if n == name]
        if mine:
            out[name] = {
                "n": len(mine),
                "ms": round(statistics.median(r["ms"] for r in mine), 4),
                "buffers": statistics.median(r["buffers"] for r in mine),
                "scans": mine[-1]["scans"],
            }
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def print_summary(summary: dict[str, Any]) -> None:
    print(
        f"\nsummary (first vs last {summary['compared_minutes']} minutes of {summary['minutes']}):"
    )
    for name in ("claim", "claim_full", "mark"):
        s = summary[name]
        print(
            f"  {name:<11} p50 {s['first']['p50']} -> {s['last']['p50']} ms (x{s['ratio_p50']}), "
            f"p99 {s['first']['p99']} -> {s['last']['p99']} ms (x{s['ratio_p99']})"
        )
    for name in (f"probe_{p}" for p in PROBES):
        if name in summary:
            s = summary[name]
            print(
                f"  {name:<11} {s['ms']['first']} -> {s['ms']['last']} ms, buffers "
                f"{s['buffers']['first']} -> {s['buffers']['last']}"
            )
    for key in (
        "rss_mb",
        "threads",
        "backlog_max",
        "oldest_due_s_max",
        "n_dead_tup_last",
        "n_dead_tup_max",
        "autovacuum_count",
        "rows_last",
        "final_states",
        "drained_after_stop_s",
        "worker_exit_codes",
        "window_ratio_last_first",
        "census",
    ):
        if key in summary:
            print(f"  {key}: {summary[key]}")
    print("\nchecks:")
    for check in summary.get("checks", []):
        print(f"  [{'PASS' if check['ok'] else 'FAIL'}] {check['name']}")
        for line in check["detail"].splitlines():
            print(f"         {line}")


def prefill(cursor: Any, count: int) -> None:
    """``count`` succeeded jobs, finished over the past six days (inside the default
    retention), as a table that has run for a while holds them (one INSERT ... SELECT per
    500,000 rows), then ANALYZE."""
    step = 500_000
    for start in range(0, count, step):
        cursor.execute(
            "INSERT INTO django_gator_job (name, args, kwargs, queue, priority, "
            "next_execution_at, state, attempts, rescues, created_at, started_at, finished_at, "
            "last_error, errors, reserved_by) "
            "SELECT 'soak.history', '[]', '{}', 'default', 0, t, 'succeeded', 1, 0, t, t, t, "
            "'', '[]', 'soak-history' FROM (SELECT now() - (i %% 518400) * interval "
            "'1 second' AS t FROM generate_series(%s, %s) AS i) AS s",
            [start + 1, min(start + step, count)],
        )
    cursor.execute("ANALYZE django_gator_job")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.markdown:
        from benchmarks.soak import report

        document = json.loads(args.markdown.read_text())
        long_tx = document["meta"].get("long_transaction")
        print(report.windows(document) if long_tx else report.comparison(document))
        return 0
    if args.chart_only:
        from benchmarks.soak.chart import draw

        document = json.loads(args.chart_only.read_text())
        target = args.chart or ROOT / "docs" / f"soak-{document['meta']['cluster']}.png"
        draw(document, target)
        print(f"chart: {target}")
        return 0
    end_on_sigterm()
    cluster = (
        ThrowawayCluster(args.port, args.pg_bindir, dayrun.cluster_settings(args))
        if args.cluster == "throwaway"
        else None
    )
    try:
        if cluster is not None:
            url = cluster.start(urlsplit_name(args.database_url))
            print(f"throwaway cluster in {cluster.directory}, port {args.port}", flush=True)
        else:
            url = args.database_url
        recreate_database(url)
        os.environ["DATABASE_URL"] = url
        os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.soak.settings"
        os.environ["GATOR_SOAK_ROLE"] = "harness"
        os.environ["GATOR_SOAK_PARTITIONING"] = (
            "" if args.partitioning == "none" else args.partitioning
        )
        os.environ["GATOR_SOAK_NOTIFY"] = args.notify
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        with connection.cursor() as cursor:
            if cluster is not None:
                cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                if args.table_autovacuum == "recommended":
                    options = ", ".join(f"{k} = {v}" for k, v in TABLE_AUTOVACUUM.items())
                    cursor.execute(f"ALTER TABLE django_gator_job SET ({options})")
            if args.prefill:
                print(f"soak: prefilling {args.prefill:,} succeeded jobs", flush=True)
                prefill(cursor, args.prefill)
        dayrun.prepare_storage(args.partitioning)
        soak = Soak(args, url, cluster)
        print(
            f"soak: {soak.rate:g} jobs/s for up to {soak.duration:g} s on {args.cluster} "
            f"({url.rsplit('@', 1)[-1]}), logs in {soak.log_dir}",
            flush=True,
        )
        summary = soak.run()
    finally:
        if cluster is not None:
            cluster.stop()
    print_summary(summary)
    print(f"report: {soak.out_path()}")
    if not args.no_chart:
        from benchmarks.soak.chart import draw

        suffix = "-long-transaction" if soak.long_tx else ""
        target = args.chart or ROOT / "docs" / f"soak-{args.cluster}{suffix}.png"
        document = json.loads(soak.out_path().read_text())
        if args.web or args.partitioning != "none":
            from benchmarks.soak import day_report

            target = args.chart or soak.out_path().with_suffix(".png")
            day_report.draw([document], target)
        else:
            draw(document, target)
        print(f"chart: {target}")
    failed = [c["name"] for c in summary.get("checks", []) if not c["ok"]]
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def urlsplit_name(url: str) -> str:
    """The database name of a URL."""
    from urllib.parse import urlsplit

    return urlsplit(url).path.lstrip("/") or "gator_soak"


def _flow_limits() -> tuple[int, float]:
    """The limited queue's concurrency and one account's starts per second (app/jobs.py)."""
    from benchmarks.soak.app import jobs
    from django_gator.limits import parse_rate

    rate = parse_rate(jobs.KEY_RATE)
    assert rate is not None
    return jobs.LIMITED_CONCURRENCY, rate.starts / rate.seconds
