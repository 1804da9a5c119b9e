from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.db import connection, connections

from django_gator.worker.queues import parse_queue_specs
from django_gator.worker.supervisor import WorkerProcess

ROOT = Path(__file__).resolve().parent.parent


def pytest_report_header(config: pytest.Config) -> str:
    import django
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    return f"django-gator: Django {django.get_version()}, database {engine}"


#: Modules whose tests all start worker processes (or servers) through their own harness
#: rather than the ``spawn_worker`` fixture.
PROCESS_MODULES = {
    "tests/reliability/test_batch_chaos.py",
    "tests/reliability/test_chaos.py",
    "tests/reliability/test_failover.py",
    "tests/reliability/test_outages.py",
    "tests/reliability/test_partitions.py",
    "tests/reliability/test_sqlite_contention.py",
    "tests/worker/test_processes.py",
    "tests/worker/test_supervision.py",
}


#: Modules whose tests that pytest-django keeps away from the database (no ``django_db``
#: mark, no database fixture) run the same code whatever DATABASE_URL says: they read no
#: vendor, make no database of their own and start nothing that reads DATABASE_URL. CI
#: runs those tests (marked ``databaseless``) on SQLite only, once per Django line. A
#: module that branches on the database belongs elsewhere: not in this list.
DATABASE_FREE_MODULES = {
    "tests/admin/test_chart.py",
    "tests/engines/test_contract_members.py",
    "tests/management/test_arguments.py",
    "tests/test_attempts.py",
    "tests/test_conf.py",
    "tests/test_conversion_bench.py",
    "tests/test_demo.py",
    "tests/test_docs.py",
    "tests/test_docs_examples.py",
    "tests/test_docs_site.py",
    "tests/test_fleet_judging.py",
    "tests/test_layers.py",
    "tests/test_packaging.py",
    "tests/test_peers_report.py",
    "tests/test_redaction.py",
    "tests/test_registry.py",
    "tests/test_retry.py",
    "tests/test_soak_day.py",
    "tests/test_style.py",
    "tests/test_validation.py",
    "tests/test_wording.py",
    "tests/worker/test_ahead.py",
    "tests/worker/test_queues.py",
    "tests/worker/test_slots.py",
}
#: Fixtures that open the database to a test (directly or through the fixtures they use).
DATABASE_FIXTURES = {
    "db",
    "transactional_db",
    "django_db_reset_sequences",
    "django_db_serialized_rollback",
    "live_server",
    "admin_user",
    "admin_client",
}


def databaseless(item: pytest.Item, path: str) -> bool:
    """A test of DATABASE_FREE_MODULES that cannot reach the database and is not skipped
    by a condition (which may name a vendor)."""
    return (
        path in DATABASE_FREE_MODULES
        and item.get_closest_marker("django_db") is None
        and not DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("skipif") is None
        and item.get_closest_marker("skip") is None
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``processes`` the tests that start real worker processes (the ``spawn_worker``
    fixture, directly or through another fixture, or a module of PROCESS_MODULES). They
    run the same worker code under every Django line, so CI's Django 6.1 line leaves them
    to the Django 5.2 line (``-m "not processes"``); ``make test`` runs them all.
    Mark ``databaseless`` the tests :func:`databaseless` finds: CI runs them on SQLite
    only (``-m "not databaseless"`` on the servers)."""
    for item in items:
        path = Path(str(item.fspath)).relative_to(ROOT).as_posix()
        if "spawn_worker" in getattr(item, "fixturenames", ()) or path in PROCESS_MODULES:
            item.add_marker(pytest.mark.processes)
        if databaseless(item, path):
            item.add_marker(pytest.mark.databaseless)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the file by which SQLite workers take turns (engines/sqlite.py) next to the
    test database, which pytest-django removes."""
    session.config._gator_exitstatus = int(exitstatus)  # type: ignore[attr-defined]
    from django.conf import settings

    db = settings.DATABASES["default"]
    name = db.get("TEST", {}).get("NAME")
    if db["ENGINE"] == "django.db.backends.sqlite3" and name:
        Path(f"{name}-gator.lock").unlink(missing_ok=True)


#: Seconds a test's setup, call or teardown may take beyond pytest-timeout's limit before
#: the backstop below ends the run.
BACKSTOP_GRACE = 120
_phase: dict[str, Any] = {}


def _backstop() -> None:
    """pytest-timeout raises in the main thread, which Python code only sees between
    bytecodes: a test stuck in C code (a driver waiting on a lock) outlives it and would
    hold the run until CI's limit. Past the test's limit and a grace, print every stack
    and exit."""
    while True:
        time.sleep(5)
        started, name, limit = _phase.get("started"), _phase.get("name"), _phase.get("limit")
        if started is None or not limit:
            continue
        if time.monotonic() - started > limit + BACKSTOP_GRACE:
            # pytest captures the test's output on file descriptor 2: give it back first.
            with contextlib.suppress(Exception):
                _phase["capture"].suspend_global_capture(in_=False)
            message = f"\n!!! {name} has run {limit + BACKSTOP_GRACE:.0f} s; stacks:\n"
            os.write(2, message.encode())
            faulthandler.dump_traceback(file=2, all_threads=True)
            os._exit(3)


def pytest_sessionstart(session: pytest.Session) -> None:
    _phase["capture"] = session.config.pluginmanager.getplugin("capturemanager")
    threading.Thread(target=_backstop, name="gator-backstop", daemon=True).start()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """The backstop's clock: the whole of a test (setup, call, teardown) against its own
    timeout (its mark, else the ini's), counted three times over for the three phases."""
    marker = item.get_closest_marker("timeout")
    limit = (
        float(marker.args[0])
        if marker and marker.args
        else float(item.config.getini("timeout") or 0)
    )
    _phase.update(started=time.monotonic(), name=item.nodeid, limit=3 * limit)
    try:
        return (yield)
    finally:
        _phase.update(started=None, name=None, limit=None)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """A thread that is not a daemon keeps the interpreter from exiting: a test that left
    one running would hold the run after its summary until CI's limit, printing nothing.
    Give such threads 10 s, then print their stacks and exit with the session's status."""
    lingering = [
        thread
        for thread in threading.enumerate()
        if thread is not threading.main_thread() and not thread.daemon and thread.is_alive()
    ]
    deadline = time.monotonic() + 10
    for thread in lingering:
        thread.join(max(0.0, deadline - time.monotonic()))
    still = [thread.name for thread in lingering if thread.is_alive()]
    if not still:
        return
    sys.stdout.flush()
    sys.stderr.write(
        f"\n!!! {len(still)} non-daemon thread(s) still running after the tests: "
        f"{', '.join(still)}; their stacks follow, then the run exits without them.\n"
    )
    faulthandler.dump_traceback(all_threads=True)
    sys.stderr.flush()
    os._exit(int(getattr(config, "_gator_exitstatus", 1)))


#: The suite runs on partitioned storage (GATOR_TEST_PARTITIONING on PostgreSQL; see
#: django_db_setup below): tests that migrate the plain jobs table back and forth skip.
PARTITIONED_SUITE = bool(os.environ.get("GATOR_TEST_PARTITIONING")) and (
    os.environ.get("DATABASE_URL", "").startswith("postgres")
)
plain_table_only = pytest.mark.skipif(
    PARTITIONED_SUITE, reason="migrates the plain jobs table (GATOR_TEST_PARTITIONING is set)"
)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> None:
    """With GATOR_PARTITIONING set (GATOR_TEST_PARTITIONING, tests/settings.py) on
    PostgreSQL, the test database's jobs table is converted to partitioned storage once,
    after the migrations: the whole suite then runs on it."""
    from django.conf import settings

    granularity = getattr(settings, "GATOR_PARTITIONING", None)
    if granularity and connection.vendor == "postgresql":
        from django_gator.engines.partition_conversion import Conversion

        with django_db_blocker.unblock():
            conversion = Conversion("default")
            if not conversion.is_partitioned():
                conversion.convert(granularity)
            conversion.drop_backup()


def database_url() -> str:
    """A DATABASE_URL for the test database, for worker subprocesses."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    scheme = {"postgresql": "postgres", "mysql": "mysql"}[connection.vendor]
    auth = quote(s["USER"] or "")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"])
    host = s["HOST"] or "localhost"
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"{scheme}://{auth}@{host}{port}/{s['NAME']}"


def worker_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        DATABASE_URL=database_url(),
        GATOR_TEST_SUBPROCESS="1",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


@pytest.fixture(autouse=True)
def _close_end_listeners() -> Iterator[None]:
    """After each test, close the LISTEN connections wait_result() opened on PostgreSQL:
    a test database with a session on it cannot be dropped."""
    yield
    from django_gator import endwatch

    endwatch.close_all()


@pytest.fixture
def spawn_worker(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start ``manage.py gator_worker`` subprocesses on the test database; killed at the end.

    Each one's output goes to a file (a pipe nobody reads could fill up and block it);
    ``worker_output(proc)`` reads it. ``prefix`` goes before the command (a wrapper)."""
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(
        *args: str,
        env: dict[str, str] | None = None,
        prefix: Sequence[str] = (),
        **popen: object,
    ) -> subprocess.Popen[bytes]:
        log_path = tmp_path / f"worker-{len(procs)}.log"
        popen.setdefault("start_new_session", True)
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", "django", "gator_worker", *args],
                cwd=ROOT,
                env=worker_env(**(env or {})),
                stdout=log,
                stderr=subprocess.STDOUT,
                **popen,  # type: ignore[arg-type]
            )
        proc.log_path = log_path  # type: ignore[attr-defined]
        procs.append(proc)
        return proc

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        # A supervisor's worker processes (each in a process group of its own) outlive it
        # when it is SIGKILLed; one wedged in C code, holding a transaction open, would
        # block the database flush after the test for ever. They share its session.
        kill_session(proc.pid)


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (Linux: read from /proc)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid:  # state, ppid, pgrp, session
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(stat.parent.name), signal.SIGKILL)


def worker_output(proc: subprocess.Popen[bytes]) -> str:
    return proc.log_path.read_text(errors="replace")  # type: ignore[attr-defined]


def run_worker(*queues: str, concurrency: int = 2, **kwargs: object) -> WorkerProcess:
    """Run a burst worker in this process until nothing is due; returns it."""
    worker = WorkerProcess(
        parse_queue_specs(queues),
        concurrency=concurrency,
        burst=True,
        install_signal_handlers=False,
        **kwargs,  # type: ignore[arg-type]
    )
    worker.run()
    return worker


def start_worker_thread(worker: WorkerProcess) -> threading.Thread:
    """Start ``worker.run()`` in a daemon thread of this process (so that a test can bound
    the wait for it), the thread's own connections closed when it ends."""

    def run() -> None:
        try:
            worker.run()
        finally:
            connections.close_all()  # this thread's (registering the worker)

    thread = threading.Thread(target=run, name="test-worker", daemon=True)
    thread.start()
    return thread


def learn_wakeup_targets(*procs: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Read this process's list of workers to wake (SQLite, MariaDB, PostgreSQL with
    GATOR_NOTIFY = False) until it has the wakeup address of each worker in ``procs`` (by
    pid): a test whose worker polls rarely dispatches next, and only a datagram can start
    that job in time. One read is not enough: a read that failed, or that came while a
    worker's heartbeat was late on a loaded machine (the list holds the workers with a
    heartbeat within GATOR_HEARTBEAT_TIMEOUT), leaves the list without it."""
    from django_gator import conf, wakeup
    from django_gator.models import Worker

    pids = [proc.pid for proc in procs]

    def known() -> bool:
        rows = Worker.objects.filter(pid__in=pids).values_list("wakeup_address", flat=True)
        addresses = {conf.split_host_port(address) for address in rows if address}
        if len(addresses) < len(pids):
            return False
        wakeup.refresh(connection.alias)
        listed = {target.address for target in wakeup._directory(connection.alias).targets}
        return addresses <= listed

    wait_for(known, timeout=timeout, interval=0.2)


def wait_for(
    predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")


def waiting_on_locks() -> int:
    """Other sessions of this test database waiting for a row lock (PostgreSQL, MariaDB).
    Poll it no faster than a few times a second: on MariaDB, reading INNODB_TRX that often
    can hold up the very statement that is to start waiting."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # Inside a transaction the activity view is read once, then kept: read it anew.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            )
        else:
            cursor.execute(
                "SELECT count(*) FROM information_schema.INNODB_TRX AS t JOIN"
                " information_schema.PROCESSLIST AS p ON p.ID = t.trx_mysql_thread_id"
                " WHERE t.trx_state = 'LOCK WAIT' AND p.DB = DATABASE()"
            )
        return int(cursor.fetchone()[0])


def listening_backends() -> int:
    """Sessions LISTENing on the test database (PostgreSQL: the workers' listeners)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query ILIKE 'LISTEN %%' AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


#: A password that dead_jobs_for_operators() puts in arguments and error messages.
SECRET = "hunter2-very-secret"


def dead_jobs_for_operators() -> dict[str, list[Any]]:
    """Dead jobs from real failed runs, for the admin tests: three logins that fail with
    PermissionError (and succeed when retried), two Booms that always fail."""
    from django_gator.models import Job
    from tests.testapp.jobs import Boom, FailsFirstTime

    FailsFirstTime.dispatch("alice", pin="pin-8642", password=SECRET)
    FailsFirstTime.dispatch("bob", password=SECRET)
    FailsFirstTime.dispatch("carol", password=SECRET)
    Boom.dispatch("disk full")
    Boom.dispatch("disk full again")
    run_worker()
    return {
        "logins": list(Job.objects.filter(name=FailsFirstTime.name)),
        "booms": list(Job.objects.filter(name=Boom.name)),
    }


def stop_worker(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGTERM a worker subprocess and assert it exits 0 (its log in the message if not).

    Waits for its worker row first: before its signal handlers are installed, a SIGTERM
    kills a worker outright, and the row appears once they are."""
    from django_gator.models import Worker

    wait_for(lambda: Worker.objects.filter(pid=proc.pid).exists(), timeout=30)
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"no exit {timeout} s after SIGTERM:\n{worker_output(proc)}") from None
    assert code == 0, worker_output(proc)


@pytest.fixture
def booby_trapped_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, Path]]:
    """An importable module whose import leaves a marker file: (module name, marker path).
    Its ``Job`` class and ``run`` function would exit the process if anything called them."""
    name = f"gator_trap_{uuid.uuid4().hex}"
    marker = tmp_path / "imported.marker"
    (tmp_path / f"{name}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
        "class Job:\n    def handle(self, *args, **kwargs):\n        raise SystemExit('pwned')\n"
        "def run(*args, **kwargs):\n    raise SystemExit('pwned')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, marker
    sys.modules.pop(name, None)


def analyze() -> None:
    """Fresh planner statistics for the jobs table (on PostgreSQL, and its visibility map,
    as autovacuum keeps them; the row estimates the admin reads come from here too)."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("ANALYZE TABLE django_gator_job")
            cursor.fetchall()
        elif connection.vendor == "postgresql":
            cursor.execute("VACUUM ANALYZE django_gator_job")
        else:
            cursor.execute("ANALYZE django_gator_job")


def run_python(code: str, *args: str) -> str:
    """Run ``code`` in a new Python process with the workers' environment (the test
    database); its stdout. Fails the test, with its stderr, if it exits non-zero."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def pg_listener():
    """A second PostgreSQL connection (psycopg, autocommit) listening for worker wakeups."""
    import psycopg

    s = connection.settings_dict
    conn = psycopg.connect(
        host=s["HOST"] or None,
        port=s["PORT"] or None,
        user=s["USER"] or None,
        password=s["PASSWORD"] or None,
        dbname=s["NAME"],
        autocommit=True,
    )
    conn.execute("LISTEN django_gator")
    yield conn
    conn.close()
