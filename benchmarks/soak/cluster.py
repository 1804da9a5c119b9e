"""The soak's databases: a throwaway PostgreSQL cluster, and a fresh database to run in."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tests.clusters import as_postgres

#: Server settings of the throwaway cluster beyond initdb's stock configuration.
CLUSTER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "autovacuum": "on",
    "shared_preload_libraries": "'pg_stat_statements'",
    "pg_stat_statements.max": "1000",
    "pg_stat_statements.track_planning": "on",  # planning apart (measure.pgss_statements)
    "log_autovacuum_min_duration": "0",  # each autovacuum run in the cluster's log
}

#: What we recommend for the jobs table (set with ALTER TABLE ... SET after migrate): vacuum
#: after 1 % of the rows plus 1,000 have changed, instead of the default 20 % + 50, which on
#: a table of finished jobs that only grows would wait longer with every hour; and without
#: the cost-based pause, since the table's hot part is small and its dead index entries are
#: what every claim steps over until vacuum removes them.
TABLE_AUTOVACUUM = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_vacuum_insert_scale_factor": "0.01",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_vacuum_cost_delay": "0",
}


def end_on_sigterm() -> None:
    """Make a SIGTERM end this process as Ctrl-C does, through its ``finally`` blocks, which
    stop its worker processes and its throwaway cluster. By default a SIGTERM (GNU make
    passes one to its recipe when it is stopped; a timeout sends one) kills the benchmark
    alone and leaves them running (a soak, 2026-11-28). Call it in a benchmark's main."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


class ThrowawayCluster:
    """initdb into a temporary directory, start on its own port, stop and remove after."""

    def __init__(
        self,
        port: int = 5499,
        bindir: str = "/usr/lib/postgresql/15/bin",
        settings: dict[str, str] | None = None,
        prefix: str = "gator-soak-pg-",
        hba: list[str] | None = None,
    ) -> None:
        """``hba``: lines added to pg_hba.conf (initdb's allows 127.0.0.1 and ::1 only)."""
        self.port = port
        self.prefix = prefix
        self.hba = hba or []
        self.bindir = Path(bindir)
        self.settings = {**CLUSTER_SETTINGS, **(settings or {})}
        self.directory: Path | None = None
        self.running = False

    @property
    def data(self) -> Path:
        assert self.directory is not None
        return self.directory / "data"

    @property
    def log(self) -> Path:
        assert self.directory is not None
        return self.directory / "server.log"

    def start(self, database: str) -> str:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                raise RuntimeError(f"port {self.port} is in use; choose another with --port")
        self.directory = Path(tempfile.mkdtemp(prefix=self.prefix))
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.directory, user.pw_uid, user.pw_gid)
        initdb = [str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres"]
        subprocess.run(
            as_postgres([*initdb, "-A", "trust", "-E", "UTF8", "--no-instructions"]),
            check=True,
            capture_output=True,
            timeout=120,
        )
        extra = {
            "port": str(self.port),
            "unix_socket_directories": f"'{self.directory}'",
            **self.settings,
        }
        conf = "".join(f"{name} = {value}\n" for name, value in extra.items())
        subprocess.run(
            as_postgres(["sh", "-c", f"cat >> {self.data / 'postgresql.conf'}"]),
            input=conf.encode(),
            check=True,
            timeout=30,
        )
        if self.hba:
            subprocess.run(
                as_postgres(["sh", "-c", f"cat >> {self.data / 'pg_hba.conf'}"]),
                input="".join(f"{line}\n" for line in self.hba).encode(),
                check=True,
                timeout=30,
            )
        pg_ctl = [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log)]
        subprocess.run(
            as_postgres([*pg_ctl, "-w", "-t", "60", "start"]),
            check=True,
            capture_output=True,
            timeout=90,
        )
        self.running = True
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def autovacuum_log(self) -> list[str]:
        """The cluster's log entries about automatic vacuums of the jobs table, each folded
        into one line."""
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return []
        entries: list[str] = []
        current: list[str] | None = None
        for line in lines:
            if line[:1].isdigit():  # a new entry starts with its timestamp
                if current:
                    entries.append(" ".join(current))
                current = [line] if "automatic vacuum of table" in line else None
            elif current is not None:
                current.append(line.strip())
        if current:
            entries.append(" ".join(current))
        return [entry for entry in entries if "django_gator_job" in entry]

    def stop(self) -> None:
        if self.running:
            subprocess.run(
                as_postgres(
                    [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]
                ),
                check=False,
                capture_output=True,
                timeout=120,
            )
            self.running = False
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


def recreate_database(url: str) -> None:
    """Drop and create the database named by ``url``. Refused unless its name says soak: the
    harness empties what it is pointed at, so it must never be pointed at real data."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if "soak" not in name:
        raise SystemExit(
            f"the soak drops and re-creates its database; {name!r} does not have 'soak' in its "
            "name, so it is refused (use e.g. .../gator_soak)"
        )
    if parts.scheme in ("mysql", "mariadb"):
        import MySQLdb

        server = MySQLdb.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=parts.username or "root",
            password=parts.password or "",
        )
        try:
            with server.cursor() as cursor:
                cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
                cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        finally:
            server.close()
        return
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        raise SystemExit(f"the soak runs on PostgreSQL or MariaDB/MySQL, not {parts.scheme!r}")
    import psycopg

    maintenance = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(maintenance, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')


def server_facts(cursor: Any) -> dict[str, Any]:
    """Version and the settings that matter for the soak, as the server reports them."""
    cursor.execute("SELECT version()")
    facts: dict[str, Any] = {"version": cursor.fetchone()[0]}
    if cursor.db.vendor != "postgresql":
        cursor.execute(
            "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('innodb_buffer_pool_size', "
            "'innodb_flush_log_at_trx_commit', 'transaction_isolation', 'tx_isolation', "
            "'max_connections', 'innodb_purge_threads')"
        )
        facts["settings"] = dict(cursor.fetchall())
        facts["version"] = f"MariaDB/MySQL {facts['version']}"
        return facts
    cursor.execute(
        "SELECT name, setting, unit FROM pg_settings WHERE name IN ('autovacuum', "
        "'autovacuum_naptime', 'autovacuum_vacuum_cost_delay', 'shared_buffers', 'fsync', "
        "'synchronous_commit', 'max_connections', 'shared_preload_libraries', 'work_mem')"
    )
    facts["settings"] = {
        name: f"{setting}{' ' + unit if unit else ''}" for name, setting, unit in cursor.fetchall()
    }
    return facts


def throwaway_arguments(parser: Any, port: int) -> None:
    """The options of a benchmark that starts a throwaway cluster: its port, PostgreSQL's
    binaries, where the JSON report goes."""
    parser.add_argument("--port", type=int, default=port, help="port of the throwaway cluster")
    parser.add_argument("--pg-bindir", default="/usr/lib/postgresql/15/bin")
    parser.add_argument("--out", type=Path, help="JSON report")


def migrated_django(url: str, settings: str) -> None:
    """Re-create the database at ``url`` (see recreate_database), point Django's settings
    module ``settings`` at it (through DATABASE_URL), set Django up and migrate."""
    recreate_database(url)
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = settings
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def run_facts(command: str) -> dict[str, Any]:
    """When, where and with what a benchmark ran (after migrated_django)."""
    import platform
    from datetime import UTC, datetime

    import django

    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "command": command,
    }
