"""Throwaway PostgreSQL clusters for the tests that stop, restart or fail over a server.

The shared server of the machine is never restarted by a test: a test that needs a server
it can break makes its own with :func:`throwaway_cluster` (initdb into a temporary folder,
its own port on 127.0.0.1) and, for a failover, a streaming standby of it
(:meth:`Cluster.standby`: ``pg_basebackup -R``, optionally synchronous). Both are stopped
and removed when the ``with`` block ends, whatever happened in it.

PostgreSQL refuses to run as root: as root, every server command runs as the ``postgres``
user (runuser), and the folder belongs to it. :func:`server_binaries` finds the binaries
(``GATOR_PG_BINDIR``, else the newest /usr/lib/postgresql/*/bin); the tests skip, saying
why, where there are none, except under CI=true, where that is an error.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

#: Settings of every throwaway cluster beyond initdb's: small, quick to stop, and its
#: connections' fate visible in its log.
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "200",
    "shared_buffers": "64MB",
    "fsync": "on",
    "wal_level": "replica",
    "max_wal_senders": "5",
    "hot_standby": "on",
    "log_connections": "off",
}


def server_binaries() -> Path | None:
    """The folder of PostgreSQL's server binaries (initdb, pg_ctl, pg_basebackup), if any."""
    configured = os.environ.get("GATOR_PG_BINDIR")
    candidates = (
        [configured]
        if configured
        else sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))[
            ::-1
        ]
    )
    for candidate in candidates:
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def as_postgres(command: list[str]) -> list[str]:
    """Run as the postgres OS user when we are root (PostgreSQL refuses to run as root)."""
    if os.geteuid() != 0:
        return command
    runuser = shutil.which("runuser")
    if runuser:
        return [runuser, "-u", "postgres", "--", *command]
    return ["su", "postgres", "-c", shlex.join(command)]


def _run(command: list[str], timeout: float = 120, **kwargs: object) -> str:
    done = subprocess.run(
        as_postgres(command), capture_output=True, text=True, timeout=timeout, **kwargs
    )  # type: ignore[call-overload]
    if done.returncode != 0:
        raise RuntimeError(
            f"{shlex.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        )
    return str(done.stdout)


class Cluster:
    """One server: its data folder, port and log, and what a test does to it."""

    def __init__(self, bindir: Path, folder: Path, port: int) -> None:
        self.bindir = bindir
        self.folder = folder
        self.port = port
        self.running = False

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def log(self) -> Path:
        return self.folder / "server.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def _pg_ctl(self, *args: str, timeout: float = 120) -> str:
        command = [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log)]
        return _run([*command, *args], timeout=timeout)

    def configure(self, **settings: str) -> None:
        """Append settings to postgresql.conf (they apply at the next start or reload)."""
        text = "".join(f"{name} = {value}\n" for name, value in settings.items())
        _run(["sh", "-c", f"cat >> {shlex.quote(str(self.data / 'postgresql.conf'))}"], input=text)

    def allow(self, network: str) -> None:
        """Let clients from ``network`` (CIDR) in without a password (pg_hba.conf; applies
        at once: the server reloads it)."""
        _run(
            ["sh", "-c", f"cat >> {shlex.quote(str(self.data / 'pg_hba.conf'))}"],
            input=f"host all all {network} trust\n",
        )
        if self.running:
            self.execute("SELECT pg_reload_conf()")

    def start(self) -> None:
        self._pg_ctl("-w", "-t", "60", "start")
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("-m", mode, "-w", "-t", "60", "stop")
        self.running = False

    def restart(self, mode: str = "fast") -> float:
        """Restart the server (``fast``: sessions terminated, a clean shutdown;
        ``immediate``: no shutdown at all, crash recovery at the start); the seconds it
        took until the server accepted connections again."""
        started = time.monotonic()
        self._pg_ctl("-m", mode, "-w", "-t", "60", "restart")
        self.running = True
        return time.monotonic() - started

    def promote(self) -> None:
        self._pg_ctl("-w", "-t", "60", "promote")

    def execute(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` with psql over TCP; its unaligned output."""
        psql = shutil.which("psql") or str(self.bindir / "psql")
        done = subprocess.run(
            [
                psql,
                "-X",
                "-A",
                "-t",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                database,
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"psql -c {sql!r} on port {self.port} failed:\n{done.stderr}")
        return done.stdout.strip()

    def standby(self, folder: Path, *, synchronous: bool) -> Cluster:
        """A streaming standby of this (running) server, started on a port of its own. With
        ``synchronous``, this server waits for the standby to confirm each commit
        (``synchronous_commit = on``, the standby named in ``synchronous_standby_names``)."""
        standby = Cluster(self.bindir, folder, free_port())
        # -R writes primary_conninfo (into postgresql.auto.conf, which wins over
        # postgresql.conf) from this connection string: the application_name is how the
        # primary's synchronous_standby_names finds the standby.
        conninfo = f"host=127.0.0.1 port={self.port} user=postgres application_name=gator_standby"
        _run(
            [
                str(self.bindir / "pg_basebackup"),
                "-d",
                conninfo,
                "-D",
                str(standby.data),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
            ],
            timeout=300,
        )
        standby.configure(port=str(standby.port), unix_socket_directories=f"'{folder}'")
        standby.start()
        if synchronous:
            self.execute("ALTER SYSTEM SET synchronous_standby_names = 'gator_standby'")
            self.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = self.execute(
                "SELECT sync_state FROM pg_stat_replication "
                "WHERE application_name = 'gator_standby' AND state = 'streaming'"
            )
            if state == ("sync" if synchronous else "async"):
                return standby
            time.sleep(0.1)
        raise RuntimeError(f"the standby on port {standby.port} did not start streaming")

    def remove(self) -> None:
        if self.running:
            with contextlib.suppress(Exception):
                self.stop("immediate")
        # A server started by pg_ctl outlives a failed stop: make sure none is left.
        pid_file = self.data / "postmaster.pid"
        with contextlib.suppress(Exception):
            pid = int(pid_file.read_text().split()[0])
            os.kill(pid, 9)
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def throwaway_cluster(**settings: str) -> Iterator[Cluster]:
    """A new PostgreSQL server on a free port, with a ``gator`` database; stopped and
    removed at the end. Raises RuntimeError if there are no server binaries."""
    bindir = server_binaries()
    if bindir is None:
        raise RuntimeError("no PostgreSQL server binaries (initdb) found")
    folder = Path(tempfile.mkdtemp(prefix="gator-cluster-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
    cluster = Cluster(bindir, folder, free_port())
    try:
        _run(
            [
                str(bindir / "initdb"),
                "-D",
                str(cluster.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-instructions",
            ]
        )
        cluster.configure(
            port=str(cluster.port),
            unix_socket_directories=f"'{folder}'",
            **{**SETTINGS, **settings},
        )
        cluster.start()
        cluster.execute("CREATE DATABASE gator")
        yield cluster
    finally:
        cluster.remove()


@contextlib.contextmanager
def standby_of(primary: Cluster, *, synchronous: bool = True) -> Iterator[Cluster]:
    """A streaming standby of ``primary``, stopped and removed at the end."""
    folder = Path(tempfile.mkdtemp(prefix="gator-standby-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
    standby = Cluster(primary.bindir, folder, 0)
    try:
        standby = primary.standby(folder, synchronous=synchronous)
        yield standby
    finally:
        standby.remove()
