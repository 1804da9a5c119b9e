"""A PgBouncer in transaction mode on the database's host, for the fleet benchmark.

The Debian ``pgbouncer`` binary, run as the postgres user (it refuses root) with a config
in a temporary directory (``gator-fleet-bouncer-*``): it listens on 127.0.0.1 and on the
host side of every namespace's link, and sends every database to the throwaway cluster on
127.0.0.1. ``pool_size`` server sessions per (database, user): fewer than the workers'
threads from four processes up, so their transactions really share server sessions.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PREFIX = "gator-fleet-bouncer-"


def binary() -> str | None:
    found = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    return found if os.path.exists(found) else None


class Bouncer:
    def __init__(self, server_port: int, port: int, addresses: list[str], pool_size: int) -> None:
        self.server_port = server_port
        self.port = port
        self.addresses = ["127.0.0.1", *addresses]
        self.pool_size = pool_size
        self.process: subprocess.Popen[bytes] | None = None
        self.directory: Path | None = None

    def start(self) -> None:
        program = binary()
        if program is None:
            raise RuntimeError("no pgbouncer: apt-get install pgbouncer (the Debian package)")
        self.directory = Path(tempfile.mkdtemp(prefix=PREFIX))
        config = self.directory / "pgbouncer.ini"
        (self.directory / "users.txt").write_text('"postgres" ""\n')
        config.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={self.server_port}\n"
            "[pgbouncer]\n"
            f"listen_addr = {','.join(self.addresses)}\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.directory / 'users.txt'}\n"
            "admin_users = postgres\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 4000\n"
            "ignore_startup_parameters = extra_float_digits\n"
            f"logfile = {self.directory / 'pgbouncer.log'}\n"
            f"pidfile = {self.directory / 'pgbouncer.pid'}\n"
        )
        account = pwd.getpwnam("postgres")
        for path in (self.directory, *self.directory.iterdir()):
            os.chown(path, account.pw_uid, account.pw_gid)
        self.process = subprocess.Popen(
            [program, "-u", "postgres", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._wait_listening()

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + 15
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited with {self.process.returncode}: {self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError as error:
                if time.monotonic() > deadline:
                    message = f"pgbouncer did not listen within 15 s: {self.log()}"
                    raise RuntimeError(message) from error
                time.sleep(0.05)

    def log(self) -> str:
        try:
            return (self.directory / "pgbouncer.log").read_text()[-2000:]  # type: ignore[operator]
        except OSError:
            return "(no log)"

    def clients(self) -> list[dict[str, str]]:
        """PgBouncer's client connections (SHOW CLIENTS on its admin console)."""
        psql = shutil.which("psql") or "/usr/lib/postgresql/15/bin/psql"
        done = subprocess.run(
            [
                psql,
                "-XA",
                "-h127.0.0.1",
                "-Upostgres",
                f"-p{self.port}",
                "-cSHOW CLIENTS",
                "pgbouncer",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        lines = [line for line in done.stdout.splitlines() if "|" in line]
        if done.returncode != 0 or not lines:
            return []
        header = lines[0].split("|")
        return [dict(zip(header, line.split("|"), strict=False)) for line in lines[1:]]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # a safe shutdown
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


def cleanup() -> list[str]:
    """Stop a pgbouncer a failed run left (by its pid file) and remove its directory."""
    removed = []
    for directory in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        try:
            pid = int((directory / "pgbouncer.pid").read_text().split()[0])
            if Path(f"/proc/{pid}/comm").read_text().strip() != "pgbouncer":
                raise ValueError(f"pid {pid} is not a pgbouncer any more")
            os.kill(pid, signal.SIGKILL)
            removed.append(f"pgbouncer {pid}")
        except (OSError, ValueError, IndexError):
            pass
        shutil.rmtree(directory, ignore_errors=True)
        removed.append(f"directory {directory}")
    return removed
