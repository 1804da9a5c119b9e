"""The fleet benchmark's machinery: the throwaway cluster, the network hosts, PgBouncer, the
worker and dispatcher processes, and what a step reads from the database and the workers'
statement timings. Everything it starts is stopped and removed by :meth:`Bench.close`,
which runs in a ``finally`` and at exit (Ctrl-C, SIGTERM and failures included).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.fleet import bouncer, netns
from benchmarks.soak.app.timing import CLAIM_KINDS
from benchmarks.soak.cluster import ThrowawayCluster
from benchmarks.soak.measure import backlog, quantile

ROOT = Path(__file__).resolve().parents[2]
DATABASE = "gator_fleet"
CLUSTER_PREFIX = "gator-fleet-pg-"


def cluster_settings(addresses: list[str]) -> dict[str, str]:
    """Production-like settings for this machine: autovacuum on, shared_buffers a quarter of
    the memory (at most 8 GB), enough connections for 12 workers' threads and listeners,
    and WAL and I/O timing on (pg_stat_wal's times)."""
    with open("/proc/meminfo") as meminfo:
        total_kb = int(meminfo.readline().split()[1])
    shared = min(total_kb // 4 // 1024, 8192)
    return {
        "listen_addresses": f"'{','.join(['127.0.0.1', *addresses])}'",
        "max_connections": "400",
        "shared_buffers": f"{shared}MB",
        "track_wal_io_timing": "on",
        "track_io_timing": "on",
        "log_autovacuum_min_duration": "-1",
    }


class Bench:
    def __init__(self, options: Any, hosts: int) -> None:
        self.options = options
        self.network = netns.Network(hosts) if hosts else None
        self.cluster: ThrowawayCluster | None = None
        self.pgbouncer: bouncer.Bouncer | None = None
        self.procs: dict[int, tuple[str, subprocess.Popen[bytes]]] = {}
        self.log_dir = Path(tempfile.mkdtemp(prefix="gator-fleet-logs-"))
        self.url = ""
        atexit.register(self.close)

    # -- setting up and tearing down ---------------------------------------------------------
    def open(self) -> None:
        if self.network is not None:
            self.network.create()
        addresses = self.network.server_addresses() if self.network else []
        self.cluster = ThrowawayCluster(
            port=self.options.port,
            bindir=self.options.pg_bindir,
            settings=cluster_settings(addresses),
            prefix=CLUSTER_PREFIX,
            hba=[f"host all all {netns.SUBNET}.0.0/16 trust"],
        )
        self.cluster.start(DATABASE)
        self.url = f"postgres://postgres@127.0.0.1:{self.options.port}/{DATABASE}"
        import psycopg

        maintenance = self.url.rsplit("/", 1)[0] + "/postgres"
        with psycopg.connect(maintenance, autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {DATABASE}")
        os.environ.update(DATABASE_URL=self.url, DJANGO_SETTINGS_MODULE="benchmarks.fleet.settings")
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)

    def start_bouncer(self) -> None:
        addresses = self.network.server_addresses() if self.network else []
        self.pgbouncer = bouncer.Bouncer(
            self.options.port, self.options.bouncer_port, addresses, self.options.pool_size
        )
        self.pgbouncer.start()

    def stop_bouncer(self) -> None:
        if self.pgbouncer is not None:
            self.pgbouncer.stop()
            self.pgbouncer = None

    def close(self) -> None:
        self.stop_all()
        self.stop_bouncer()
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
        if self.network is not None:
            self.network.remove()
        if not self.options.keep_logs:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    # -- processes -----------------------------------------------------------------------------
    def env(self, role: str, url: str, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": "benchmarks.fleet.settings",
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            "GATOR_FLEET_ROLE": role,
            **extra,
        }

    def spawn_worker(self, index: int, timings: Path, pooled: bool) -> int:
        """Worker ``index`` (0-based) on host ``index % hosts`` (the database's host when the
        bench has no network), through PgBouncer when ``pooled``."""
        host = self.network.hosts[index % len(self.network.hosts)] if self.network else None
        address = host.server_address if host else "127.0.0.1"
        port = self.options.bouncer_port if pooled else self.options.port
        role = f"w{index + 1}@{host.label if host else 'db'}"
        extra = {"GATOR_SOAK_TIMINGS": str(timings)}
        if pooled:
            extra["GATOR_FLEET_POOLED"] = "1"
            extra["GATOR_FLEET_DIRECT_URL"] = (
                f"postgres://postgres@{address}:{self.options.port}/{DATABASE}"
            )
        if self.options.worker == "raw":
            command = [sys.executable, "-m", "benchmarks.fleet.rawworker", "--job"]
            command.append(self.options.job)
        else:
            command = [sys.executable, "-m", "django", "gator_worker", "-q", "fleet"]
        command += ["--concurrency", str(self.options.concurrency)]
        if host:
            command = host.command(command)
        url = f"postgres://postgres@{address}:{port}/{DATABASE}"
        return self._spawn(role, command, self.env(role, url, **extra))

    def spawn_dispatcher(self, *args: str) -> int:
        command = [sys.executable, "-m", "benchmarks.fleet.dispatch", "--job", self.options.job]
        return self._spawn("dispatcher", [*command, *args], self.env("dispatcher", self.url))

    def _spawn(self, role: str, command: list[str], env: dict[str, str]) -> int:
        log = self.log_dir / f"{role.replace('@', '-')}-{time.time():.0f}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE if role == "dispatcher" else out,
                stderr=out,
            )
        self.procs[proc.pid] = (role, proc)
        return proc.pid

    def wait_started(self, pid: int) -> float:
        """The Unix time the dispatcher ``pid`` began to dispatch (its first line)."""
        role, proc = self.procs[pid]
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {role} exited at start-up; see {self.log_dir}")
        return float(json.loads(line)["started"])

    def roles(self) -> dict[int, str]:
        found = {pid: role for pid, (role, _) in self.procs.items()}
        found[os.getpid()] = "harness"
        if self.pgbouncer is not None and self.pgbouncer.process is not None:
            found[self.pgbouncer.process.pid] = "pgbouncer"
        return found

    def stop(self, pid: int, grace: float = 0.0) -> dict[str, Any]:
        """Stop one process (after ``grace`` seconds for it to end by itself: SIGTERM, then
        SIGKILL after 60 s more); a dispatcher's last JSON line."""
        role, proc = self.procs.pop(pid)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        if role != "dispatcher":
            return {"returncode": proc.returncode}
        lines = (out or b"").decode().strip().splitlines()
        result = json.loads(lines[-1]) if lines else {}
        if "sent" not in result:  # a SIGTERM as it exits may end it by the signal: fine
            raise RuntimeError(f"the dispatcher failed ({proc.returncode}); see {self.log_dir}")
        return dict(result)

    def stop_all(self) -> None:
        for pid in list(self.procs):
            self.stop(pid)

    def check_alive(self) -> None:
        for role, proc in self.procs.values():
            if proc.poll() is not None:
                raise RuntimeError(f"{role} exited with {proc.returncode}; see {self.log_dir}")

    # -- the database --------------------------------------------------------------------------
    def wait_registered(self, count: int, timeout: float = 120) -> None:
        """Until ``count`` worker processes have registered (the control, rawworker.py,
        registers nothing: until its processes' sessions are open)."""
        deadline = time.monotonic() + timeout
        while self._registered() < count:
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count} workers did not register within {timeout:.0f} s")
            time.sleep(0.2)

    def _registered(self) -> int:
        from django.db import connection

        from django_gator.models import Worker

        if self.options.worker != "raw":
            return Worker.objects.count()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
                "WHERE application_name LIKE %s",
                ["gator-fleet-w%"],
            )
            return int(cursor.fetchone()[0])

    def reset(self) -> None:
        """Empty the jobs, workers and written rows (no worker may be running) and vacuum."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "TRUNCATE django_gator_job, django_gator_worker, gator_fleet_written CASCADE"
            )
            cursor.execute("VACUUM ANALYZE")

    def backlog(self) -> tuple[int, float]:
        from django.db import connection

        with connection.cursor() as cursor:
            return backlog(cursor)

    def server_now(self) -> Any:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT statement_timestamp()")
            return cursor.fetchone()[0]

    def finished_between(self, start: Any, end: Any) -> int:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM django_gator_job WHERE state = 'succeeded' "
                "AND finished_at >= %s AND finished_at < %s",
                [start, end],
            )
            return int(cursor.fetchone()[0])


def claim_latency(directory: Path, start: float, end: float) -> dict[str, Any]:
    """p50/p99/max (ms) of the claims the workers timed between two Unix times."""
    durations: list[float] = []
    rows = 0
    for path in directory.glob("timings-*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[1] in CLAIM_KINDS and start <= float(parts[0]) < end:
                durations.append(float(parts[2]) / 1000)
                rows += int(parts[3])
    durations.sort()

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    return {
        "n": len(durations),
        "p50_ms": ms(quantile(durations, 0.5)),
        "p99_ms": ms(quantile(durations, 0.99)),
        "max_ms": ms(durations[-1] if durations else None),
        "limit_mean": round(rows / len(durations), 1) if durations else None,
    }


def cleanup() -> list[str]:
    """Remove what a failed or killed run left: its worker and dispatcher processes, the
    namespaces and links, a pgbouncer, and throwaway clusters (stopped, their directories
    deleted)."""
    removed = leftover_processes() + netns.cleanup() + bouncer.cleanup()
    for directory in Path(tempfile.gettempdir()).glob(f"{CLUSTER_PREFIX}*"):
        data = directory / "data"
        if (data / "postmaster.pid").exists():
            cluster = ThrowawayCluster(prefix=CLUSTER_PREFIX)
            cluster.directory, cluster.running = directory, True
            cluster.stop()
            removed.append(f"cluster {directory}")
        shutil.rmtree(directory, ignore_errors=True)
    return removed


def leftover_processes() -> list[str]:
    """Kill the worker and dispatcher processes of a run whose harness died: those whose
    environment names a fleet role (GATOR_FLEET_ROLE, set by :meth:`Bench.env` only)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        role = next((v[17:].decode() for v in environ if v.startswith(b"GATOR_FLEET_ROLE=")), "")
        if role == "dispatcher" or (role.startswith("w") and "@" in role):
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)
                found.append(f"process {entry.name} ({role})")
    return found
