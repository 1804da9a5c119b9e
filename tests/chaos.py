"""The chaos harness: worker processes under fire, then a ledger check of what ran.

It starts ``--workers`` ``manage.py gator_worker`` processes, dispatches jobs that write
one ledger row (``testapp.Execution``) per run, injects faults while they drain, restarts
what died, and checks the outcome against the guarantees of RELIABILITY.md:

- lost: a job that did not end ``succeeded``, or ended so without ever running;
- stuck: a row left ``running`` once every worker has stopped;
- duplicated beyond the in-flight set: more runs than claims, or an extra attempt that no
  recorded error (a rescue after a kill, a failure on a killed connection) explains;
- over the attempt limit: more rescues than ``GATOR_MAX_RESCUES`` or more attempts than
  the retry policy allows;
- atomic duplicates: an atomic job whose ledger row (written in the job's transaction)
  exists more or less than once.

A share of the jobs misbehave on their first attempt (``Misbehaves``): exceptions with NUL
bytes, a raising ``__str__``, lone surrogates, a BaseException subclass, a transaction left
open, a session left read-only, a stray non-daemon thread. Their first error must be what
they did; every other job's ledger row must still be there.

Faults: ``sigkill``, ``sigterm`` (graceful stop, then a new worker), ``sigstop`` (frozen
past the heartbeat timeout, then SIGCONT: a zombie whose late writes must change
nothing), ``connkill`` (every worker connection killed by the server) and ``pg_restart``
(PostgreSQL restarted with pg_ctlcluster; needs root). On a throwaway server of the
run's own (``server``, a :class:`tests.clusters.Cluster`): ``restart_fast`` and
``restart_immediate`` (``pg_ctl restart -m fast`` / ``-m immediate``), and ``failover``
(the primary stopped with ``-m immediate``, its standby promoted; the workers reach it
through a multi-host connection string).

A share of the plain jobs (``no_retry_share``) has no retry policy: a database outage
must not kill them. Their attempts cut short by an outage are given back (an error entry
marked ``outage``); the check counts only the charged ones against the attempts. After
the run, no gracefully stopped worker may have left its row behind.

From the tests: ``tests/reliability/test_chaos.py`` runs it on the test database. By hand, on a
database of your own (its job and ledger tables are emptied first)::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/chaos \\
        python -m tests.chaos --jobs 10000 --kills 20 --faults sigterm=3,sigstop=2,connkill=3 --yes
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
FAULTS = (
    "sigkill",
    "sigterm",
    "sigstop",
    "connkill",
    "pg_restart",
    "restart_fast",
    "restart_immediate",
    "failover",
)
#: Faults done to the run's own throwaway server.
SERVER_FAULTS = ("restart_fast", "restart_immediate", "failover")
#: Faults that break the workers' database connections.
CONNECTION_FAULTS = ("connkill", "pg_restart", *SERVER_FAULTS)
#: Mean pause between two faults, in seconds.
FAULT_GAP = 0.6
T = TypeVar("T")


@dataclass
class Report:
    database: str
    jobs: int
    atomic_jobs: int
    misbehaving_jobs: int
    workers: int
    concurrency: int
    faults: dict[str, int]
    elapsed_s: float = 0.0
    lost: list[int] = field(default_factory=list)
    stuck: list[int] = field(default_factory=list)
    duplicated: list[int] = field(default_factory=list)
    over_limit: list[int] = field(default_factory=list)
    atomic_duplicates: list[int] = field(default_factory=list)
    rerun_jobs: int = 0
    hit_jobs: int = 0
    rescued_jobs: int = 0
    failed_attempts: int = 0
    outage_retries: int = 0  # attempts given back after an outage (not charged)
    in_flight_at_faults: int = 0  # jobs running while connections broke (connkill, restarts)
    #: Attempts run again after an outage whose ledger row had committed before the job saw
    #: its connection break (at least once: the job's write happened twice).
    outage_reruns: int = 0
    rescue_s: list[float] = field(default_factory=list)
    #: Per server fault: seconds from its start until a job succeeded again.
    recover_s: list[float] = field(default_factory=list)
    bad_exits: list[str] = field(default_factory=list)
    #: Rows of workers that stopped gracefully and are still there after the run.
    leftover_workers: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)  # what each finding looked like

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.stuck
            or self.duplicated
            or self.over_limit
            or self.atomic_duplicates
            or self.bad_exits
            or self.leftover_workers
        )

    def summary(self) -> str:
        rescue = (
            f"min {min(self.rescue_s):.2f} s / median {statistics.median(self.rescue_s):.2f} s"
            f" / max {max(self.rescue_s):.2f} s over {len(self.rescue_s)} kills"
            if self.rescue_s
            else "n/a"
        )
        faults = ", ".join(f"{k}={v}" for k, v in self.faults.items() if v) or "none"
        return (
            f"chaos on {self.database}: {self.jobs} jobs ({self.atomic_jobs} atomic, "
            f"{self.misbehaving_jobs} misbehaving), "
            f"{self.workers} workers x {self.concurrency} threads, faults: {faults}\n"
            f"  drained in {self.elapsed_s:.1f} s; lost {len(self.lost)}, stuck "
            f"{len(self.stuck)}, duplicated beyond in-flight {len(self.duplicated)}, over the "
            f"attempt limit {len(self.over_limit)}, atomic duplicates "
            f"{len(self.atomic_duplicates)}, bad worker exits {len(self.bad_exits)}\n"
            f"  jobs that met a fault {self.hit_jobs}, of which run more than once "
            f"{self.rerun_jobs}; rescued "
            f"{self.rescued_jobs}, failed attempts {self.failed_attempts}, attempts given "
            f"back after an outage {self.outage_retries}\n"
            f"  kill -> rescue of the victim's last job: {rescue}\n"
            f"  server fault -> a job succeeds again: {self.recover_s or 'n/a'} s; worker "
            f"rows left behind {len(self.leftover_workers)}"
            + "".join(f"\n  ! {line}" for line in self.details[:20])
        )


def _retry_db(action: Callable[[], T], attempts: int = 60) -> T:
    """Run a query from the harness, reconnecting while the server restarts."""
    from django.db import DatabaseError, InterfaceError, connection

    for attempt in range(attempts):
        try:
            return action()
        except (DatabaseError, InterfaceError):
            if attempt == attempts - 1:
                raise
            connection.close()
            time.sleep(0.5)
    raise AssertionError("unreachable")


def backend_id() -> int:
    """The server's id for this thread's connection (what connkill would kill)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_backend_pid()"
            if connection.vendor == "postgresql"
            else "SELECT CONNECTION_ID()"
        )
        return int(cursor.fetchone()[0])


def kill_backend(backend: int) -> None:
    """Have the server kill the connection whose id is ``backend`` (``pg_terminate_backend``,
    ``KILL CONNECTION``), from a connection of its own."""
    from django.db import connection, connections

    other = connections.create_connection(connection.alias)
    try:
        with other.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT pg_terminate_backend(%s)", [backend])
            else:
                cursor.execute(f"KILL CONNECTION {int(backend)}")
    finally:
        other.close()


def kill_worker_connections(spare: frozenset[int] = frozenset()) -> int:
    """Kill every other connection to this database (the workers'), but those whose
    backend ids are in ``spare``; returns how many."""
    from django.db import connection

    mine = backend_id()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            kill = "SELECT pg_terminate_backend(%s)"
        elif connection.vendor == "mysql":
            cursor.execute("SELECT id FROM information_schema.PROCESSLIST WHERE db = DATABASE()")
            kill = "KILL CONNECTION %s"
        else:
            raise ValueError(f"connkill needs a database server, not {connection.vendor}")
        killed = 0
        for (other,) in cursor.fetchall():
            if other == mine or other in spare:
                continue
            try:
                cursor.execute(kill, [int(other)])
                killed += 1
            except Exception:  # it ended by itself meanwhile
                continue
        return killed


def restart_postgresql(port: int = 5432) -> None:
    """Restart the local PostgreSQL cluster that listens on ``port`` (Debian's
    pg_lsclusters and pg_ctlcluster, as root)."""
    tool, lister = shutil.which("pg_ctlcluster"), shutil.which("pg_lsclusters")
    if tool is None or lister is None or os.geteuid() != 0:
        raise RuntimeError("pg_restart needs pg_ctlcluster, pg_lsclusters and root")
    listing = subprocess.run([lister, "-h"], check=True, capture_output=True, text=True).stdout
    # Each line: version, name, port, status, owner, data directory, log file.
    clusters = [
        line.split()[:2] for line in listing.splitlines() if line.split()[2:3] == [str(port)]
    ]
    if not clusters:
        raise RuntimeError(f"no local PostgreSQL cluster listens on port {port}:\n{listing}")
    version, name = clusters[0]
    subprocess.run(
        [tool, "--skip-systemctl-redirect", version, name, "restart"],  # fast mode
        check=True,
        capture_output=True,
        timeout=120,
    )


class Chaos:
    """One chaos run. ``env`` is the workers' environment (DATABASE_URL and settings)."""

    def __init__(
        self,
        *,
        env: dict[str, str],
        jobs: int = 1000,
        atomic_share: float = 0.2,
        misbehave_share: float = 0.05,
        workers: int = 3,
        concurrency: int = 4,
        kills: int = 5,
        faults: dict[str, int] | None = None,
        seed: int = 20261123,
        log_dir: Path | None = None,
        heartbeat_timeout: float = 3.0,
        max_rescues: int = 10,
        no_retry_share: float = 0.0,
        drain_s: float | None = None,
        server: Any = None,
        standby: Any = None,
    ) -> None:
        from django.db import connection

        unknown = set(faults or {}) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown fault {sorted(unknown)[0]!r}; known: {', '.join(FAULTS)}")
        self.vendor = connection.vendor
        plan = ["sigkill"] * kills
        for name, count in (faults or {}).items():
            if count and name == "connkill" and self.vendor == "sqlite":
                raise ValueError("connkill needs a database server; SQLite has none")
            if count and name == "pg_restart" and self.vendor != "postgresql":
                raise ValueError("pg_restart needs PostgreSQL")
            if count and name in SERVER_FAULTS and server is None:
                raise ValueError(f"{name} needs a throwaway server of the run's own")
            if count and name == "failover" and (standby is None or count > 1):
                raise ValueError("failover needs a standby, and can be done once")
            plan += [name] * count
        self.rng = random.Random(seed)
        self.rng.shuffle(plan)
        self.plan = plan
        self.jobs = jobs
        self.atomic_share = atomic_share
        self.misbehave_share = misbehave_share
        self.workers = workers
        self.concurrency = concurrency
        self.heartbeat_timeout = heartbeat_timeout
        self.max_rescues = max_rescues
        self.no_retry_share = no_retry_share
        self.drain_s = drain_s
        self.server = server
        self.standby = standby
        self.recover_s: list[float] = []
        self.env = {
            **env,
            "GATOR_HEARTBEAT_TIMEOUT": str(heartbeat_timeout),
            "GATOR_MAX_RESCUES": str(max_rescues),
            "GATOR_SHUTDOWN_TIMEOUT": "20",
        }
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="gator-chaos-"))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stopping: list[subprocess.Popen[bytes]] = []  # SIGTERMed, exiting
        self.frozen: list[tuple[float, subprocess.Popen[bytes]]] = []  # (thaw at, proc)
        self.all_procs: list[subprocess.Popen[bytes]] = []
        self.watch: list[tuple[float, list[str]]] = []  # (kill time, worker ids)
        self.done_faults: Counter[str] = Counter()
        self.kills: list[tuple[float, list[str]]] = []  # (time.time() of a SIGKILL, ids)
        self.hit: set[int] = set()  # jobs running when connections were broken
        self.victims: set[str] = set()  # worker ids of killed and frozen workers
        self.events: list[str] = []  # what was done when, for the report
        self.bad_exits: list[str] = []
        self.watcher_backend = 0  # the connection that watches running rows during a fault

    # -- processes -------------------------------------------------------------------
    def spawn(self) -> subprocess.Popen[bytes]:
        log = self.log_dir / f"worker-{len(self.all_procs)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "django",
                    "gator_worker",
                    "--concurrency",
                    str(self.concurrency),
                ],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        proc.log_path = log  # type: ignore[attr-defined]
        self.all_procs.append(proc)
        return proc

    def _registered(self) -> set[int]:
        from django_gator.models import Worker

        return set(_retry_db(lambda: list(Worker.objects.values_list("pid", flat=True))))

    def _worker_ids(self, pid: int) -> list[str]:
        from django_gator.models import Worker

        return _retry_db(lambda: list(Worker.objects.filter(pid=pid).values_list("id", flat=True)))

    # -- the run ---------------------------------------------------------------------
    def dispatch(self) -> list[int]:
        from tests.testapp.jobs import AtomicRecord, Misbehaves
        from tests.testapp.jobs import OutageTolerantRecord as Record
        from tests.testapp.jobs import OutageTolerantRecordWithRetry as RecordWithRetry

        atomic = int(self.jobs * self.atomic_share)
        odd = int(self.jobs * self.misbehave_share)
        # Long enough a drain for every planned fault to land while jobs are in flight:
        # about 1.5 times the plan's length, spread over the jobs as random sleeps.
        target = self.drain_s or 1.5 * len(self.plan) * FAULT_GAP
        mean = target * self.workers * self.concurrency / max(self.jobs - atomic, 1)
        plain = [
            {"label": f"p{i}", "sleep": round(self.rng.uniform(0, 2 * mean), 4)}
            for i in range(self.jobs - atomic - odd)
        ]
        bare = int(len(plain) * self.no_retry_share)
        ids = [j.pk for j in Record.dispatch_many(plain[:bare])] if bare else []
        ids += [j.pk for j in RecordWithRetry.dispatch_many(plain[bare:])]
        kinds = Misbehaves.KINDS
        ids += [
            j.pk
            for j in Misbehaves.dispatch_many(
                [{"label": f"m{i}", "kind": kinds[i % len(kinds)]} for i in range(odd)]
            )
        ]
        ids += [
            j.pk for j in AtomicRecord.dispatch_many([{"label": f"a{i}"} for i in range(atomic)])
        ]
        return ids

    def run(self) -> Report:
        from django_gator.models import Job, JobState

        self.dispatch()
        self.procs = [self.spawn() for _ in range(self.workers)]
        started = time.monotonic()
        pending = list(self.plan)
        # The first fault strikes once jobs run: a fault while the workers still start up
        # (seconds on a loaded machine) meets no job in flight and proves little.
        while not self._running(attempts=600):
            if time.monotonic() > started + 120:
                raise AssertionError(f"no job started within 120 s; logs in {self.log_dir}")
            time.sleep(0.05)

        def unfinished() -> bool:
            return _retry_db(lambda: Job.objects.exclude(state=JobState.SUCCEEDED).exists())

        deadline = started + 120 + self.jobs / 20
        while pending and unfinished():
            self._tick()
            time.sleep(self.rng.uniform(0.5, 1.5) * FAULT_GAP)
            self._fault(pending.pop(0))
            if time.monotonic() > deadline:
                raise AssertionError(f"the chaos run took too long; logs in {self.log_dir}")
        while unfinished():
            self._tick()
            if time.monotonic() > deadline:
                raise AssertionError(f"the jobs did not drain; logs in {self.log_dir}")
            time.sleep(0.1)
        while self.frozen or self.watch:
            self._tick()
            time.sleep(0.1)
        elapsed = time.monotonic() - started
        self._stop_all()
        report = self.check()
        report.elapsed_s = round(elapsed, 1)
        return report

    def _tick(self) -> None:
        """Thaw frozen workers when due, reap stopped ones, time the rescues."""

        now = time.monotonic()
        for thaw_at, proc in list(self.frozen):
            if now >= thaw_at:
                proc.send_signal(signal.SIGCONT)
                self.frozen.remove((thaw_at, proc))
        for proc in list(self.stopping):
            if proc.poll() is not None:
                self.stopping.remove(proc)
                if proc.returncode != 0:
                    self.bad_exit(proc, f"exit {proc.returncode} after SIGTERM")
        for killed_at, ids in list(self.watch):
            if not self._running(ids):
                self.watch.remove((killed_at, ids))
            elif now - killed_at > 120:
                raise AssertionError(f"jobs of killed workers {ids} were never rescued")

    def bad_exit(self, proc: subprocess.Popen[bytes], what: str) -> None:
        self.bad_exits.append(f"pid {proc.pid}: {what} (log {proc.log_path})")  # type: ignore[attr-defined]

    def _victim(self) -> int:
        """A live worker that has registered (its signal handlers are installed)."""
        deadline = time.monotonic() + 30
        while True:
            registered = self._registered()
            ready = [
                i
                for i, p in enumerate(self.procs)
                if p.pid in registered
                and p.poll() is None
                and all(p is not f for _, f in self.frozen)
            ]
            if ready:
                return self.rng.choice(ready)
            # A frozen SQLite worker may hold the write lock that the others need to
            # register: thaw it when its time comes, as the main loop would.
            self._tick()
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no worker registered within 30 s (registered pids {sorted(registered)}, "
                    f"ours {[(p.pid, p.poll()) for p in self.procs]}); logs in {self.log_dir}"
                )
            time.sleep(0.05)

    def _watch_running(self, stop: threading.Event, ready: threading.Event) -> None:
        from django.db import DatabaseError, InterfaceError, connection

        try:
            if self.vendor != "sqlite":
                self.watcher_backend = _retry_db(backend_id)  # spared by connkill
            ready.set()
            while not stop.is_set():
                try:
                    self.hit |= self._running(attempts=1)
                except (DatabaseError, InterfaceError):
                    connection.close()
                stop.wait(0.02)
        finally:
            connection.close()

    def _running(self, worker_ids: list[str] | None = None, attempts: int = 60) -> set[int]:
        from django_gator.models import Job, JobState

        running = Job.objects.filter(state=JobState.RUNNING)
        if worker_ids is not None:
            running = running.filter(reserved_by__in=worker_ids)
        return set(_retry_db(lambda: list(running.values_list("pk", flat=True)), attempts))

    def _fault(self, fault: str) -> None:
        self.done_faults[fault] += 1
        if fault in CONNECTION_FAULTS:
            # Every job running from just before the fault until the workers are back may
            # meet a broken connection (and fail, to be retried): a second connection
            # watches the running rows all that time.
            stop = threading.Event()
            ready = threading.Event()
            watcher = threading.Thread(target=self._watch_running, args=(stop, ready))
            watcher.start()
            ready.wait(30)
            self.hit |= self._running()
            try:
                if fault == "connkill":
                    spare = frozenset({self.watcher_backend})
                    _retry_db(lambda: kill_worker_connections(spare))
                elif fault in SERVER_FAULTS:
                    self._server_fault(fault)
                else:
                    from django.db import connection

                    restart_postgresql(int(connection.settings_dict.get("PORT") or 5432))
                time.sleep(1.0)
            finally:
                stop.set()
                watcher.join()
            return
        index = self._victim()
        proc = self.procs[index]
        ids = self._worker_ids(proc.pid)
        self.events.append(f"{fault} pid {proc.pid} ids {ids}")
        if fault in ("sigkill", "sigstop"):
            self.victims.update(ids)
        if fault == "sigkill":
            proc.send_signal(signal.SIGKILL)
            self.kills.append((time.time(), ids))
            killed_at = time.monotonic()
            proc.wait(timeout=10)
            if self._running(ids):  # wait for its rescue before the run ends
                self.watch.append((killed_at, ids))
            self.procs[index] = self.spawn()
        elif fault == "sigterm":
            proc.send_signal(signal.SIGTERM)
            self.stopping.append(proc)
            self.procs[index] = self.spawn()
        elif fault == "sigstop":
            proc.send_signal(signal.SIGSTOP)
            self.frozen.append((time.monotonic() + self.heartbeat_timeout + 2, proc))
            # Its jobs are rescued by the others; after SIGCONT it goes on as a worker.

    def _server_fault(self, fault: str) -> None:
        """Restart the run's own server, or fail over to its standby; then time how long
        until a job succeeds again."""
        from django_gator.models import Job, JobState

        def succeeded() -> int:
            return _retry_db(lambda: Job.objects.filter(state=JobState.SUCCEEDED).count(), 600)

        before = succeeded()
        started = time.monotonic()
        if fault == "failover":
            self.server.stop("immediate")
            self.standby.promote()
            self.events.append(f"failover: port {self.server.port} -> {self.standby.port}")
        else:
            took = self.server.restart(fault.removeprefix("restart_"))
            self.events.append(f"{fault}: the server was back after {took:.2f} s")
        deadline = started + 120
        while succeeded() <= before:
            if time.monotonic() > deadline:
                raise AssertionError(f"no job succeeded within 120 s of {fault}")
            time.sleep(0.05)
        self.recover_s.append(round(time.monotonic() - started, 2))

    def _stop_all(self) -> None:
        from django_gator.models import Worker

        live = [p for p in self.procs + self.stopping if p.poll() is None]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pids = set(_retry_db(lambda: list(Worker.objects.values_list("pid", flat=True))))
            if {p.pid for p in live} <= pids:
                break
            time.sleep(0.05)
        self.stopped_ids = {worker_id for proc in live for worker_id in self._worker_ids(proc.pid)}
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        for proc in live:
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                self.bad_exit(proc, "no exit 60 s after SIGTERM")
                continue
            if code != 0:
                self.bad_exit(proc, f"exit {code} after SIGTERM")

    def kill_everything(self) -> None:
        for proc in self.all_procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(timeout=10)

    # -- the ledger check ------------------------------------------------------------------
    def check(self) -> Report:
        from django.db.models import Count

        from django_gator.models import Job, JobState, Worker
        from tests.testapp.jobs import AtomicRecord, Misbehaves
        from tests.testapp.jobs import OutageTolerantRecord as Record
        from tests.testapp.jobs import OutageTolerantRecordWithRetry as RecordWithRetry
        from tests.testapp.models import Execution

        runs = dict(
            Execution.objects.values("job_id").annotate(n=Count("id")).values_list("job_id", "n")
        )
        report = Report(
            database=self.vendor,
            jobs=self.jobs,
            atomic_jobs=int(self.jobs * self.atomic_share),
            misbehaving_jobs=int(self.jobs * self.misbehave_share),
            workers=self.workers,
            concurrency=self.concurrency,
            faults={name: self.done_faults[name] for name in FAULTS},
            bad_exits=list(self.bad_exits),
            recover_s=list(self.recover_s),
            in_flight_at_faults=len(self.hit),
            outage_reruns=Execution.objects.filter(label__endswith="+again").count(),
            leftover_workers=sorted(
                set(Worker.objects.values_list("id", flat=True))
                & getattr(self, "stopped_ids", set())
            ),
        )
        limits = {
            Record.name: 0,
            AtomicRecord.name: AtomicRecord.retry.max_retries,
            RecordWithRetry.name: RecordWithRetry.retry.max_retries,
            Misbehaves.name: Misbehaves.retry.max_retries,
        }
        rows = Job.objects.values_list(
            "pk", "name", "state", "attempts", "rescues", "errors", "kwargs"
        )
        rescued_at: dict[str, list[float]] = {}  # worker id -> when its jobs were rescued
        for pk, name, state, attempts, rescues, errors, kwargs in rows:
            for e in errors or []:
                if e.get("class") == "django_gator.exceptions.WorkerLost" and e.get("at"):
                    when = datetime.fromisoformat(e["at"]).timestamp()
                    rescued_at.setdefault(e["worker"], []).append(when)
            n = runs.get(pk, 0)
            if state == JobState.RUNNING:
                report.stuck.append(pk)
                report.details.append(f"job {pk}: stuck running")
            if state != JobState.SUCCEEDED or n == 0:
                report.lost.append(pk)
            # A job runs again only if a fault struck while it was in flight: each run is
            # one claim (the ledger's unique (job, attempt) key), every attempt after the
            # first follows a recorded error, and each error is a fault's doing: a rescue
            # from a killed or frozen worker (never from a live one), or a failure of a
            # job that was running when the connections broke (these jobs never fail
            # by themselves).
            # A misbehaving job's own error: its first attempt's, of the class its kind
            # raises (a stray thread's job raises nothing).
            own = Misbehaves.ERRORS.get(kwargs.get("kind", "")) if name == Misbehaves.name else None
            # An attempt cut short by a database outage is given back: its entry (marked
            # "outage") is explained like any failure of a job in flight at the fault, and
            # is not counted against the attempts.
            # An outage entry may also come from a connection the fault broke and a job
            # met later than the watch of running rows (an idle executor's).
            connection_faults = sum(self.done_faults[f] for f in CONNECTION_FAULTS)
            explained = all(
                e.get("worker") in self.victims
                if e.get("class") == "django_gator.exceptions.WorkerLost"
                else (own is not None and e.get("attempt") == 1 and e.get("class") == own)
                or pk in self.hit
                or (bool(e.get("outage")) and connection_faults > 0)
                for e in errors or []
            )
            charged = [e for e in errors or [] if not e.get("outage")]
            report.outage_retries += len(errors or []) - len(charged)
            if not explained or n > attempts or attempts - 1 != len(charged):
                report.duplicated.append(pk)
                report.details.append(
                    f"job {pk}: runs {n}, attempts {attempts}, rescues {rescues}, hit "
                    f"{pk in self.hit}, errors "
                    + "; ".join(
                        f"{e.get('class')} by {e.get('worker')} on attempt {e.get('attempt')}"
                        for e in errors or []
                    )
                )
            if rescues > self.max_rescues or attempts > 1 + limits[name] + rescues:
                report.over_limit.append(pk)
            if name == AtomicRecord.name and n != 1:
                report.atomic_duplicates.append(pk)
            report.rerun_jobs += n > 1
            report.hit_jobs += bool(errors)
            report.rescued_jobs += rescues > 0
            report.failed_attempts += len(charged) - rescues
        # Kill -> rescue: from the SIGKILL to the rescue of the victim's last job (the
        # rescuer's clock, in the error entry it wrote), for kills that left jobs behind.
        for killed_at, ids in self.kills:
            after = [t for i in ids for t in rescued_at.get(i, []) if t >= killed_at]
            if after:
                report.rescue_s.append(round(max(after) - killed_at, 2))
        report.rescue_s.sort()
        return report


def _parse_faults(text: str) -> dict[str, int]:
    faults: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, count = part.partition("=")
        if name not in FAULTS:
            raise argparse.ArgumentTypeError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
        try:
            faults[name] = int(count or "1")
        except ValueError:
            raise argparse.ArgumentTypeError(f"fault count must be an integer: {part!r}") from None
    return faults


def _cluster(spec: str | None) -> Any:
    """A :class:`tests.clusters.Cluster` from ``DATA:PORT`` (its data folder and port)."""
    if not spec:
        return None
    from tests.clusters import Cluster, server_binaries

    data, _, port = spec.rpartition(":")
    bindir = server_binaries()
    if bindir is None:
        raise SystemExit("no PostgreSQL server binaries for --server/--standby")
    return Cluster(bindir, Path(data).parent, int(port))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs (default 20)")
    parser.add_argument(
        "--faults", type=_parse_faults, default={}, help="e.g. sigterm=3,connkill=2"
    )
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=20261123)
    parser.add_argument(
        "--no-retry-share", type=float, default=0.0, help="plain jobs without a retry policy"
    )
    parser.add_argument("--drain-s", type=float, help="seconds of work to spread over the jobs")
    parser.add_argument(
        "--server", metavar="DATA:PORT", help="the run's own server (restart_*, failover)"
    )
    parser.add_argument("--standby", metavar="DATA:PORT", help="its standby (failover)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--yes", action="store_true", help="empty the job and ledger tables")
    args = parser.parse_args(argv)
    if not os.environ.get("DATABASE_URL"):
        parser.error("set DATABASE_URL to the database to run on (its tables are emptied)")
    if not args.yes:
        parser.error("this empties the job and ledger tables of DATABASE_URL: pass --yes")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    os.environ["GATOR_TEST_SUBPROCESS"] = "1"  # the real database, not a test database
    import django

    django.setup()
    from django.core.management import call_command

    from django_gator.models import Job
    from tests.testapp.models import Execution

    # The test app has no migrations: its ledger table is made as the test runner does.
    call_command("migrate", verbosity=0, run_syncdb=True)
    Job.objects.all().delete()
    Execution.objects.all().delete()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    chaos = Chaos(
        env=env,
        jobs=args.jobs,
        kills=args.kills,
        faults=args.faults,
        workers=args.workers,
        concurrency=args.concurrency,
        seed=args.seed,
        no_retry_share=args.no_retry_share,
        drain_s=args.drain_s,
        server=_cluster(args.server),
        standby=_cluster(args.standby),
    )
    try:
        report = chaos.run()
    finally:
        chaos.kill_everything()
    print(json.dumps(asdict(report), indent=2) if args.json else report.summary())
    print(f"worker logs: {chaos.log_dir}", file=sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
