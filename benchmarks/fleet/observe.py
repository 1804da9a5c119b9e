"""What the fleet benchmark watches during a step, from outside the processes it measures.

A :class:`Watch` samples every ``interval`` seconds in a thread of the harness, over a
connection of its own (application_name ``gator-fleet-observer``, left out of every count):

- CPU of each process, from /proc/PID/stat, summed by role: each worker process (``w3@h2``:
  worker 3 on host 2), the dispatcher, PgBouncer, and PostgreSQL's processes by the
  application_name of their session (``backend:w3@h2``; through PgBouncer a server session
  carries its current client's name) or their backend_type (``pg:autovacuum worker``,
  ``pg:walwriter``, ...); a pid's CPU since the last sample goes to its current role;
- the machine's CPU (/proc/stat): busy and iowait shares of all CPUs;
- what the benchmark's active sessions wait for (pg_stat_activity.wait_event_type and
  wait_event; ``CPU`` when none): the share of samples each;
- row and object locks not granted (pg_locks): mean and largest count;
- sessions per application_name and client address, and the workers' sessions (their
  LISTEN sessions apart) per client address: the largest count seen of each.

:meth:`Watch.totals` gives the step's figures, with the deltas of pg_stat_wal,
pg_stat_bgwriter and /proc/diskstats (every disk) between the watch's start and end.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from typing import Any

from benchmarks.soak.measure import proc_cpu_ticks

CLK_TCK = os.sysconf("SC_CLK_TCK")
OBSERVER = "gator-fleet-observer"
APP_PREFIX = "gator-fleet-"


def host_cpu() -> tuple[int, int, int]:
    """(total, idle, iowait) ticks of all CPUs so far (/proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    return sum(fields[:8]), fields[3], fields[4]


def diskstats() -> dict[str, tuple[int, int, int, int]]:
    """Per whole disk: (writes completed, sectors written, flushes completed, ms doing I/O)."""
    whole = {
        name for name in os.listdir("/sys/block") if not name.startswith(("loop", "ram", "zram"))
    }
    disks: dict[str, tuple[int, int, int, int]] = {}
    with open("/proc/diskstats") as stats:
        for line in stats:
            fields = line.split()
            if fields[2] in whole:
                flushes = int(fields[17]) if len(fields) > 17 else 0
                disks[fields[2]] = (int(fields[7]), int(fields[9]), flushes, int(fields[12]))
    return disks


WAL_COLUMNS = (
    "wal_records",
    "wal_bytes",
    "wal_buffers_full",
    "wal_write",
    "wal_sync",
    "wal_write_time",
    "wal_sync_time",
)
BGWRITER_COLUMNS = (
    "checkpoints_timed",
    "checkpoints_req",
    "checkpoint_write_time",
    "checkpoint_sync_time",
    "buffers_checkpoint",
    "buffers_clean",
    "buffers_backend",
    "buffers_backend_fsync",
)


def server_counters(cursor: Any) -> dict[str, float]:
    cursor.execute(f"SELECT {', '.join(WAL_COLUMNS)} FROM pg_stat_wal")
    values = dict(zip(WAL_COLUMNS, cursor.fetchone(), strict=True))
    cursor.execute(f"SELECT {', '.join(BGWRITER_COLUMNS)} FROM pg_stat_bgwriter")
    values.update(zip(BGWRITER_COLUMNS, cursor.fetchone(), strict=True))
    return {name: float(value or 0) for name, value in values.items()}


def backend_role(app: str | None, backend_type: str | None) -> str:
    if app and app.startswith(APP_PREFIX):
        return f"backend:{app.removeprefix(APP_PREFIX)}"
    return f"pg:{backend_type or 'other'}"


class Watch:
    """Samples in a thread from :meth:`start` to :meth:`stop`; see the module's docstring."""

    def __init__(self, url: str, processes: dict[int, str], interval: float = 1.0) -> None:
        self.url = url
        self.processes = dict(processes)  # pid -> role, the harness's own children
        self.interval = interval
        self.cpu: Counter[str] = Counter()  # role -> ticks
        self.last: dict[int, int] = {}
        self.waits: Counter[str] = Counter()
        self.active_samples = 0
        self.ungranted: list[int] = []
        self.sessions: Counter[tuple[str, str]] = Counter()
        self.worker_sessions: Counter[str] = Counter()  # client address -> largest count
        self.samples = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-watch", daemon=True)

    def start(self) -> None:
        import psycopg

        self.connection = psycopg.connect(self.url, autocommit=True, application_name=OBSERVER)
        with self.connection.cursor() as cursor:
            self.counters0 = server_counters(cursor)
        self.disks0, self.host0, self.t0 = diskstats(), host_cpu(), time.monotonic()
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(timeout=30)
        with self.connection.cursor() as cursor:
            counters = server_counters(cursor)
        self.connection.close()
        if self.error is not None:
            raise RuntimeError(f"the watch failed: {self.error!r}") from self.error
        return self.totals(counters, diskstats(), host_cpu(), time.monotonic() - self.t0)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                self.sample()
        except BaseException as error:  # reported by stop()
            self.error = error

    def sample(self) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid, application_name, backend_type, state, wait_event_type, "
                "wait_event, host(client_addr) FROM pg_stat_activity WHERE pid <> "
                "pg_backend_pid()"
            )
            rows = cursor.fetchall()
            cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
            self.ungranted.append(int(cursor.fetchone()[0]))
        roles = dict(self.processes)
        sessions: Counter[tuple[str, str]] = Counter()
        for pid, app, backend_type, state, wait_type, wait, client in rows:
            roles[pid] = backend_role(app, backend_type)
            if not (app or "").startswith(APP_PREFIX):
                continue
            sessions[(app.removeprefix(APP_PREFIX), client or "local")] += 1
            if state == "active":
                self.active_samples += 1
                self.waits[f"{wait_type}:{wait}" if wait_type else "CPU"] += 1
        by_client: Counter[str] = Counter()
        for (app, client), count in sessions.items():
            self.sessions[(app, client)] = max(self.sessions[(app, client)], count)
            if app.startswith("w") and "@" in app and not app.endswith("-listen"):
                by_client[client] += count
        for client, count in by_client.items():
            self.worker_sessions[client] = max(self.worker_sessions[client], count)
        for pid, role in roles.items():
            ticks = proc_cpu_ticks(pid)
            if ticks is None:
                continue
            if pid in self.last:
                self.cpu[role] += max(ticks - self.last[pid], 0)
            self.last[pid] = ticks
        self.samples += 1

    def totals(
        self,
        counters: dict[str, float],
        disks: dict[str, tuple[int, int, int, int]],
        host: tuple[int, int, int],
        seconds: float,
    ) -> dict[str, Any]:
        total = max(host[0] - self.host0[0], 1)
        cores = {
            role: round(ticks / CLK_TCK / seconds, 3) for role, ticks in self.cpu.most_common()
        }
        disk = {}
        for name, (writes, sectors, flushes, busy) in disks.items():
            w0, s0, f0, b0 = self.disks0.get(name, (writes, sectors, flushes, busy))
            disk[name] = {
                "writes_per_s": round((writes - w0) / seconds, 1),
                "mb_written_per_s": round((sectors - s0) * 512 / 1e6 / seconds, 2),
                "flushes_per_s": round((flushes - f0) / seconds, 1),
                "busy_share": round((busy - b0) / 1000 / seconds, 3),
            }
        server = {
            f"{name}_per_s": round((counters[name] - self.counters0[name]) / seconds, 2)
            for name in counters
        }
        active = max(self.active_samples, 1)
        return {
            "seconds": round(seconds, 1),
            "samples": self.samples,
            "cores_by_role": cores,
            "load_average": [round(value, 2) for value in os.getloadavg()],
            "host_busy_share": round(1 - (host[1] - self.host0[1]) / total, 3),
            "host_iowait_share": round((host[2] - self.host0[2]) / total, 3),
            "wait_shares": {k: round(v / active, 3) for k, v in self.waits.most_common(12)},
            "locks_not_granted_mean": round(sum(self.ungranted) / max(len(self.ungranted), 1), 2),
            "locks_not_granted_max": max(self.ungranted, default=0),
            "sessions": {
                f"{app}@{client}": n for (app, client), n in sorted(self.sessions.items())
            },
            "worker_sessions_by_client": dict(sorted(self.worker_sessions.items())),
            "server_per_s": server,
            "disks": disk,
        }
