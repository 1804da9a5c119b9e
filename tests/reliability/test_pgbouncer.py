"""Workers behind a real PgBouncer in transaction pooling mode (PostgreSQL only).

The suite starts its own ``pgbouncer`` (the Debian package; ``make test-postgres`` installs
it as root) on a free port, with a config in a temporary directory, in front of the test
database's server. Worker subprocesses reach the database only through it (the settings
put ``default`` behind it and in GATOR_POOLED_DATABASES, tests/settings.py); the pool has
fewer server connections than the workers have threads, so consecutive transactions of one
thread really run on different server sessions. Without pgbouncer the tests skip, except
under CI=true, where they fail.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from django_gator.conf import InvalidSetting
from django_gator.engines import get_engine
from django_gator.models import Job, JobState
from django_gator.worker.connections import NetworkBounds
from django_gator.worker.supervisor import WorkerProcess
from tests.conftest import (
    ROOT,
    learn_wakeup_targets,
    listening_backends,
    stop_worker,
    wait_for,
    worker_env,
    worker_output,
)
from tests.testapp.jobs import Record, Sleep
from tests.testapp.models import Execution

on_postgres = pytest.mark.skipif(
    settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql",
    reason="PgBouncer is a PostgreSQL pooler",
)
#: The tests of LISTEN through a pooler: a run with GATOR_TEST_NOTIFY=off sends no NOTIFY.
listening = pytest.mark.skipif(
    not getattr(settings, "GATOR_NOTIFY", True),
    reason="GATOR_NOTIFY is off in this run: workers bind a wakeup socket and do not LISTEN",
)

#: Server connections per (database, user) pair: fewer than two workers' threads.
POOL_SIZE = 4


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PgBouncer:
    port: int
    directory: Path

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a subprocess that reaches the database through PgBouncer."""
        return {"GATOR_TEST_PGBOUNCER_PORT": str(self.port), **extra}

    def admin(self, command: str) -> str:
        """A command on PgBouncer's admin console (simple query protocol: psql)."""
        user = settings.DATABASES["default"]["USER"] or "postgres"
        return subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", user, "-At", "pgbouncer"],
            input=command,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout


@pytest.fixture(scope="module")
def pgbouncer() -> Iterator[PgBouncer]:
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not os.path.exists(binary):
        message = "no pgbouncer (make test-postgres installs it with apt-get as root)"
        if _in_ci():
            pytest.fail(f"{message}; CI is set, so this is an error")
        pytest.skip(message)
    db = settings.DATABASES["default"]
    user = db["USER"] or "postgres"
    directory = Path(tempfile.mkdtemp(prefix="gator-pgbouncer-"))
    port = _free_port()
    (directory / "users.txt").write_text(f'"{user}" "{db.get("PASSWORD") or ""}"\n')
    (directory / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {directory / 'users.txt'}\n"
        f"admin_users = {user}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {POOL_SIZE}\n"
        "max_client_conn = 500\n"
        "ignore_startup_parameters = extra_float_digits\n"
        f"logfile = {directory / 'pgbouncer.log'}\n"
        f"pidfile = {directory / 'pgbouncer.pid'}\n"
    )
    command = [binary]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        try:
            account = pwd.getpwnam("postgres")
        except KeyError:
            account = pwd.getpwnam("nobody")
        for path in (directory, *directory.iterdir()):
            os.chown(path, account.pw_uid, account.pw_gid)
        command += ["-u", account.pw_name]
    process = subprocess.Popen(
        [*command, str(directory / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            if process.poll() is not None:
                error = process.stderr.read().decode() if process.stderr else ""
                pytest.fail(f"pgbouncer exited with {process.returncode}: {error}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("pgbouncer did not listen within 15 s")
                time.sleep(0.05)
        yield PgBouncer(port, directory)
    finally:
        process.send_signal(signal.SIGINT)  # a safe shutdown
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
        shutil.rmtree(directory, ignore_errors=True)


def run_through(pgbouncer: PgBouncer, code: str) -> None:
    """Run ``code`` in ``manage.py shell`` in a subprocess that goes through PgBouncer."""
    subprocess.run(
        [sys.executable, "-m", "django", "shell", "-c", code],
        cwd=ROOT,
        env=worker_env(**pgbouncer.env()),
        check=True,
        timeout=120,
    )


def transactions_through(pgbouncer: PgBouncer) -> int:
    """Transactions PgBouncer has passed to the test database so far."""
    name = connection.settings_dict["NAME"]
    total = 0
    for line in pgbouncer.admin("SHOW STATS;").splitlines():
        cells = line.split("|")
        if cells[0] == name:
            total += int(cells[1])  # total_xact_count
    return total


@on_postgres
@pytest.mark.django_db(transaction=True)
def test_a_drain_by_two_worker_processes_through_pgbouncer_loses_nothing(pgbouncer, spawn_worker):
    run_through(
        pgbouncer,
        "from tests.testapp.jobs import Record\n"
        "for i in range(40): Record.dispatch(f'one-{i}')\n"
        "Record.dispatch_many([[f'many-{i}'] for i in range(360)])\n",
    )
    assert Job.objects.filter(state=JobState.WAITING).count() == 400
    before = transactions_through(pgbouncer)
    workers = [spawn_worker("--burst", "--concurrency", "4", env=pgbouncer.env()) for _ in range(2)]
    for worker in workers:
        assert worker.wait(timeout=180) == 0, worker_output(worker)
    # Every job ran exactly once (Execution's unique key refuses a second run of a claim).
    assert Job.objects.filter(state=JobState.SUCCEEDED, attempts=1).count() == 400
    assert Execution.objects.count() == 400
    assert set(Execution.objects.values_list("job_id", flat=True)) == set(
        Job.objects.values_list("id", flat=True)
    )
    assert set(Execution.objects.values_list("pid", flat=True)) <= {w.pid for w in workers}
    # It all went through PgBouncer: 400 ledger inserts alone are 400 transactions.
    assert transactions_through(pgbouncer) - before >= 400
    for worker in workers:
        assert "No LISTEN" not in worker_output(worker)  # burst workers do not listen


@on_postgres
@pytest.mark.django_db(transaction=True)
def test_heartbeats_and_rescue_work_through_pgbouncer(pgbouncer, spawn_worker, tmp_path):
    started = tmp_path / "started"
    job = Sleep.dispatch(2, label="victim", started_file=str(started))
    lost = spawn_worker("--concurrency", "1", env=pgbouncer.env())
    wait_for(started.exists, timeout=60)
    lost.send_signal(signal.SIGKILL)
    lost.wait(timeout=10)
    rescuer = spawn_worker("--concurrency", "2", env=pgbouncer.env())
    wait_for(lambda: Job.objects.filter(pk=job.pk, state=JobState.SUCCEEDED).exists(), timeout=60)
    job.refresh_from_db()
    assert job.attempts == 2
    assert "stopped heartbeating" in job.errors[0]["message"]
    [run] = Execution.objects.filter(job_id=job.pk)
    assert run.pid == rescuer.pid
    stop_worker(rescuer)


@on_postgres
@listening
@pytest.mark.django_db(transaction=True)
def test_the_listener_works_through_gator_listen_database(pgbouncer, spawn_worker):
    # A 30 s poll: a job that starts within seconds was woken by NOTIFY.
    env = pgbouncer.env(
        GATOR_TEST_LISTEN_DATABASE="direct", GATOR_POLL_INTERVAL="30", GATOR_LOG_LEVEL="DEBUG"
    )
    worker = spawn_worker("--concurrency", "2", env=env)
    wait_for(lambda: listening_backends() == 1, timeout=60)
    _woken_three_times(worker)
    stop_worker(worker)
    assert "No LISTEN" not in worker_output(worker)


def _woken_three_times(worker: subprocess.Popen[bytes]) -> None:
    """Three times: once the worker is idle (its poll 30 s away), dispatch a job and see it
    start within seconds."""
    for i in range(3):
        # The fetcher's last claim found nothing: it now waits for a wakeup (or 30 s).
        wait_for(lambda i=i: worker_output(worker).count("Worker idle") > i, timeout=30)
        started = time.monotonic()
        job = Record.dispatch(f"wake-{i}")
        wait_for(lambda job=job: Execution.objects.filter(job_id=job.pk).exists(), timeout=20)
        assert time.monotonic() - started < 10, worker_output(worker)


@on_postgres
@listening
@pytest.mark.django_db(transaction=True)
def test_without_gator_listen_database_a_pooled_worker_polls_and_says_so(pgbouncer, spawn_worker):
    worker = spawn_worker("--concurrency", "2", env=pgbouncer.env(GATOR_POLL_INTERVAL="0.2"))
    job = Record.dispatch("polled")
    wait_for(lambda: Execution.objects.filter(job_id=job.pk).exists(), timeout=60)
    assert listening_backends() == 0
    stop_worker(worker)
    output = worker_output(worker)
    assert re.search(
        r"No LISTEN: database 'default' is behind a transaction pooler .* polling for new "
        r"jobs every 0.2 s",
        output,
    ), output


@on_postgres
@pytest.mark.django_db(transaction=True)
def test_with_notify_off_a_pooled_worker_is_woken_by_datagrams(pgbouncer, spawn_worker):
    # GATOR_NOTIFY = False in the worker and here: no LISTEN anywhere, no direct alias,
    # and a 30 s poll, so a job that starts within seconds was woken by a datagram.
    env = pgbouncer.env(GATOR_TEST_NOTIFY="off", GATOR_POLL_INTERVAL="30", GATOR_LOG_LEVEL="DEBUG")
    worker = spawn_worker("--concurrency", "2", env=env)
    with override_settings(GATOR_NOTIFY=False):
        learn_wakeup_targets(worker, timeout=60)  # this process learns the worker's address
        _woken_three_times(worker)
    assert listening_backends() == 0
    stop_worker(worker)
    assert "No LISTEN" not in worker_output(worker)


@on_postgres
@pytest.mark.django_db(transaction=True)
def test_a_pooled_alias_gets_no_session_settings_and_no_server_side_prepares(settings):
    engine = get_engine("default")

    def show(name: str) -> str:
        with connection.cursor() as cursor:
            cursor.execute(f"SHOW {name}")
            return str(cursor.fetchone()[0])

    try:
        connection.close()
        settings.GATOR_POOLED_DATABASES = ["default"]
        engine.prepare_bookkeeping()
        assert show("synchronous_commit") == "on"
        assert show("plan_cache_mode") == "auto"
        assert connection.connection.prepare_threshold is None
        idle = show("tcp_keepalives_idle")
        engine.prepare_worker_session(connection.connection, NetworkBounds.for_timeout(30))
        assert show("tcp_keepalives_idle") == idle
        # Not pooled: the same calls set the session (what the pooled path must not do).
        connection.close()
        settings.GATOR_POOLED_DATABASES = []
        engine.prepare_bookkeeping()
        assert show("synchronous_commit") == "off"
        assert show("plan_cache_mode") == "force_generic_plan"  # the prepared claims
        engine.prepare_worker_session(connection.connection, NetworkBounds.for_timeout(30))
        assert show("tcp_keepalives_idle") == "10"
    finally:
        connection.close()


@pytest.mark.django_db
def test_a_listen_database_that_is_not_configured_is_a_clear_startup_error(settings):
    settings.GATOR_LISTEN_DATABASE = "nope"
    with pytest.raises(InvalidSetting, match=r"GATOR_LISTEN_DATABASE = 'nope' is not a key"):
        WorkerProcess(install_signal_handlers=False)
